"""A hotel front desk: rooms by type, reservations with stays and guest requests."""
from __future__ import annotations

from typing import Annotated, Literal

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, at_least_one, contains, eq, match,
                                                 parse_date, ref, set_fields)

RoomType = Literal["single", "double", "suite"]
REQUESTS = ("late checkout", "extra pillows", "airport shuttle", "quiet room", "baby cot", "early breakfast")


def _day(date: str) -> int:
    return parse_date(date).toordinal()


class HotelEnv(DomainEnv):
    def _free(self, room_id: str, check_in: str, nights: int, ignore: str = "") -> bool:
        start = _day(check_in)
        return all(r["room_id"] != room_id or r["status"] != "confirmed" or rid == ignore
                   or start + nights <= _day(r["check_in"]) or _day(r["check_in"]) + r["nights"] <= start
                   for rid, r in self.reservations.items())

    @tool
    def find_available_rooms(self, room_type: Annotated[RoomType, "single, double or suite."],
                             check_in: Annotated[str, "arrival day, YYYY-MM-DD."],
                             nights: Annotated[int, "length of the stay."]) -> list:
        """Rooms of a type that are free for a whole stay, by room number."""
        at_least_one(nights, "nights")
        return [{"room_id": rid, "rate": r["rate"]} for rid, r in sorted(self.rooms.items())
                if r["room_type"] == room_type and self._free(rid, check_in, nights)]

    @tool
    def make_reservation(self, room_id: Annotated[str, "the room."],
                         guest_name: Annotated[str, "the guest's full name."],
                         check_in: Annotated[str, "arrival day, YYYY-MM-DD."],
                         nights: Annotated[int, "length of the stay."]) -> dict:
        """Reserve a room."""
        room = self._get("rooms", room_id, "room")
        if nights < 1 or not self._free(room_id, check_in, nights):
            raise ToolError("the room is not free for that stay")
        reservation = {"room_id": room_id, "room_type": room["room_type"], "guest": guest_name, "check_in": check_in,
                       "nights": nights, "status": "confirmed", "requests": []}
        return {"reservation_id": self._insert("reservations", "RS", reservation), "total": room["rate"] * nights}

    @tool
    def find_reservations(self, guest_name: Annotated[str, "the guest's full name."]) -> list:
        """A guest's confirmed reservations, by arrival day."""
        found = self._select("reservations", "reservation_id", guest=guest_name, status="confirmed")
        return sorted(found, key=lambda r: r["check_in"])

    @tool
    def extend_stay(self, reservation_id: Annotated[str, "the reservation."],
                    extra_nights: Annotated[int, "nights to add."]) -> dict:
        """Add nights to a reservation, if the room stays free."""
        r = self._get("reservations", reservation_id, "reservation")
        if extra_nights < 1 or not self._free(r["room_id"], r["check_in"], r["nights"] + extra_nights,
                                              ignore=reservation_id):
            raise ToolError("the room is not free for the longer stay")
        r["nights"] += extra_nights
        return {"reservation_id": reservation_id, "nights": r["nights"]}

    @tool
    def add_request(self, reservation_id: Annotated[str, "the reservation."],
                    request: Annotated[str, "the request, e.g. late checkout."]) -> dict:
        """Note a guest request on a reservation."""
        r = self._get("reservations", reservation_id, "reservation")
        r["requests"].append(request)
        return {"reservation_id": reservation_id, "requests": r["requests"]}

    cancel_reservation = set_fields("reservations", "reservation", "Cancel a reservation.", "the reservation.",
                                    status="cancelled")


def _hotel(pick: Pick) -> dict:
    rooms = {}
    for floor in (1, 2, 3):
        for n, room_type in enumerate(("single", "single", "double", "double", "suite")):
            rooms[f"{floor}{n + 1:02d}"] = {"room_type": room_type, "rate": {"single": 90, "double": 140,
                                                                            "suite": 300}[room_type] + 10 * floor}
    return {"rooms": rooms, "reservations": {}, "next_id": pick.counter()}


def _reserve(init: dict, rid: str, room_id: str, guest: str, check_in: str, nights: int) -> None:
    init["reservations"][rid] = {"room_id": room_id, "room_type": init["rooms"][room_id]["room_type"], "guest": guest,
                                 "check_in": check_in, "nights": nights, "status": "confirmed", "requests": []}


def book_room(pick: Pick) -> Draft:
    init = _hotel(pick)
    room_type = pick.choice(("single", "double", "suite"))
    check_in, nights, guest = pick.date(lo=1, hi=20), pick.randint(1, 5), pick.people(1)[0]
    taken = sorted(r for r, v in init["rooms"].items() if v["room_type"] == room_type)[:pick.randint(0, 2)]
    for rid, room_id, other in zip(pick.ids("RS", len(taken), digits=3), taken, pick.people(len(taken))):
        _reserve(init, rid, room_id, other, check_in, nights)
    d = Draft(f"Book a {room_type} room for {guest}, arriving {check_in} for {nights} night(s).", init)
    c0 = d.call("find_available_rooms", room_type=room_type, check_in=check_in, nights=nights)
    d.call("make_reservation", room_id=ref(c0, 0, "room_id"), guest_name=guest, check_in=check_in, nights=nights)
    return d.check(match("reservations", {"guest": guest, "check_in": check_in, "nights": nights,
                                          "status": "confirmed"}),
                   match("reservations", {"guest": guest, "room_type": room_type, "status": "confirmed"}))


def extend_with_request(pick: Pick) -> Draft:
    init = _hotel(pick)
    guest, room_id = pick.people(1)[0], pick.choice(sorted(init["rooms"]))
    rid, nights, extra = pick.ids("RS", 1, digits=3)[0], pick.randint(1, 4), pick.randint(1, 3)
    _reserve(init, rid, room_id, guest, pick.date(lo=1, hi=20), nights)
    request = pick.choice(REQUESTS)
    d = Draft(f"{guest} would like to stay {extra} more night(s). Extend the reservation and note the request "
              f"'{request}' on it.", init)
    c0 = d.call("find_reservations", guest_name=guest)
    d.call("extend_stay", reservation_id=ref(c0, 0, "reservation_id"), extra_nights=extra)
    d.call("add_request", reservation_id=ref(c0, 0, "reservation_id"), request=request)
    return d.check(eq(("reservations", rid, "nights"), nights + extra),
                   contains(("reservations", rid, "requests"), request))


def cancel_one(pick: Pick) -> Draft:
    init = _hotel(pick)
    guest = pick.people(1)[0]
    dates, rids = pick.dates(2), pick.ids("RS", 2, digits=3)
    for rid, date, room_id in zip(rids, dates, pick.sample(sorted(init["rooms"]), 2)):
        _reserve(init, rid, room_id, guest, date, 1)
    index = pick.randrange(2)
    d = Draft(f"Cancel {guest}'s reservation that starts on {dates[index]}; keep their other one.", init)
    c0 = d.call("find_reservations", guest_name=guest)
    d.call("cancel_reservation", reservation_id=ref(c0, index, "reservation_id"))
    return d.check(eq(("reservations", rids[index], "status"), "cancelled"))


DOMAIN = Domain(
    name="hotel", env_class=HotelEnv,
    introduction="The reservation system of a three-floor city hotel.",
    rules=("A room holds one confirmed reservation per night.", "Stays are counted in nights from check-in."),
    kinds=(book_room, extend_with_request, cancel_one),
)
