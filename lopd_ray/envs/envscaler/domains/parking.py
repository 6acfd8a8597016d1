"""City parking: lots by area, paid parking sessions by licence plate, fines."""
from __future__ import annotations

from typing import Annotated

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, eq, increase, match, ref

AREAS = ("old town", "harbour", "station", "university", "stadium", "market", "riverside", "airport")


def _plate(pick: Pick) -> str:
    letters = "".join(pick.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(3))
    return f"{letters}-{pick.randint(100, 999)}"


class ParkingEnv(DomainEnv):
    def _active(self, session_id: str) -> dict:
        return self._get_in_state("sessions", session_id, "session", "the session has ended", status="active")

    @tool
    def find_lots(self, area: Annotated[str, "the city area, e.g. harbour."]) -> list:
        """The lots of an area with free spaces and hourly rates, cheapest first."""
        return sorted(self._select("lots", "lot_id", area=area), key=lambda lot: (lot["hourly_rate"], lot["lot_id"]))

    @tool
    def start_parking(self, lot_id: Annotated[str, "the lot."], plate: Annotated[str, "the licence plate."],
                      hours: Annotated[int, "paid hours."]) -> dict:
        """Start a paid session for a car in a lot with a free space."""
        lot = self._get("lots", lot_id, "lot")
        if lot["free_spaces"] < 1 or hours < 1:
            raise ToolError("the lot is full, or hours is below 1")
        lot["free_spaces"] -= 1
        session_id = self._insert("sessions", "PS", {"lot_id": lot_id, "plate": plate, "hours": hours,
                                                     "status": "active"})
        return {"session_id": session_id, "cost": hours * lot["hourly_rate"]}

    @tool
    def extend_parking(self, session_id: Annotated[str, "the session."],
                       extra_hours: Annotated[int, "hours to add."]) -> dict:
        """Pay for more hours of an active session."""
        hours = increase(self._active(session_id), "hours", extra_hours, "extra_hours")
        return {"session_id": session_id, "hours": hours}

    @tool
    def end_parking(self, session_id: Annotated[str, "the session."]) -> dict:
        """End an active session; the space becomes free."""
        session = self._active(session_id)
        session["status"] = "ended"
        self.lots[session["lot_id"]]["free_spaces"] += 1
        return {"session_id": session_id, "status": "ended"}

    @tool
    def find_sessions(self, plate: Annotated[str, "the licence plate."]) -> list:
        """The active sessions of a licence plate."""
        return self._select("sessions", "session_id", plate=plate, status="active")

    @tool
    def list_fines(self, plate: Annotated[str, "the licence plate."]) -> list:
        """The unpaid fines of a licence plate."""
        return self._select("fines", "fine_id", plate=plate, paid=False)

    @tool
    def pay_fine(self, fine_id: Annotated[str, "the fine."]) -> dict:
        """Pay a fine."""
        self._get_in_state("fines", fine_id, "fine", "already paid", paid=False)["paid"] = True
        return {"fine_id": fine_id, "paid": True}


def _city(pick: Pick) -> dict:
    lots = {}
    for area in pick.sample(AREAS, 4):
        rates = pick.sample(range(1, 9), 2)
        for lid, rate in zip(pick.ids("LOT", 2, digits=3), rates):
            lots[lid] = {"name": f"{area.title()} {pick.choice(('Garage', 'Plaza', 'Deck'))}", "area": area,
                         "hourly_rate": rate, "free_spaces": pick.randint(1, 60)}
    return {"lots": lots, "sessions": {}, "fines": {}, "next_id": pick.counter()}


def park_and_extend(pick: Pick) -> Draft:
    init = _city(pick)
    area = pick.choice(sorted({lot["area"] for lot in init["lots"].values()}))
    cheapest = min((lid for lid, lot in init["lots"].items() if lot["area"] == area),
                   key=lambda lid: init["lots"][lid]["hourly_rate"])
    plate, hours, extra = _plate(pick), pick.randint(1, 4), pick.randint(1, 3)
    d = Draft(f"Park car {plate} in the cheapest lot of the {area} area for {hours} hour(s), then extend that session "
              f"by {extra} hour(s).", init)
    c0 = d.call("find_lots", area=area)
    c1 = d.call("start_parking", lot_id=ref(c0, 0, "lot_id"), plate=plate, hours=hours)
    d.call("extend_parking", session_id=ref(c1, "session_id"), extra_hours=extra)
    return d.check(match("sessions", {"lot_id": cheapest, "plate": plate, "hours": hours + extra, "status": "active"}),
                   eq(("lots", cheapest, "free_spaces"), init["lots"][cheapest]["free_spaces"] - 1))


def leave_and_settle(pick: Pick) -> Draft:
    init = _city(pick)
    plate, lot_id = _plate(pick), pick.choice(list(init["lots"]))
    sid = pick.ids("PS", 1, digits=3)[0]
    init["sessions"][sid] = {"lot_id": lot_id, "plate": plate, "hours": 2, "status": "active"}
    init["lots"][lot_id]["free_spaces"] -= 1
    fines = pick.ids("FN", pick.randint(1, 3), digits=3)
    for fid in fines:
        init["fines"][fid] = {"plate": plate, "amount": pick.choice((20, 40, 60)), "paid": False}
    init["fines"][pick.ids("FX", 1, digits=3)[0]] = {"plate": _plate(pick), "amount": 20, "paid": False}
    d = Draft(f"Car {plate} is leaving: end its parking session and pay all of its unpaid fines.", init)
    c0 = d.call("find_sessions", plate=plate)
    d.call("end_parking", session_id=ref(c0, 0, "session_id"))
    c2 = d.call("list_fines", plate=plate)
    for i in range(len(fines)):
        d.call("pay_fine", fine_id=ref(c2, i, "fine_id"))
    return d.check(eq(("sessions", sid, "status"), "ended"), *(eq(("fines", f, "paid"), True) for f in fines))


DOMAIN = Domain(
    name="parking", env_class=ParkingEnv,
    introduction="A city's parking service: public lots, paid sessions by licence plate, and parking fines.",
    rules=("A session needs a free space in its lot.", "Ended sessions cannot be extended."),
    kinds=(park_and_extend, leave_and_settle),
)
