"""A gym: members with class credits and plans, a weekly class timetable with capacities."""
from __future__ import annotations

from typing import Annotated, Literal

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, contains, eq, find_by_field, increase,
                                                 not_contains, ref)

Day = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
DAY_NAMES = dict(zip(DAYS, ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")))
CLASSES = ("Yoga", "Spin", "Pilates", "HIIT", "Boxing", "Zumba", "Core", "Stretch")


class GymEnv(DomainEnv):
    def _member_and_class(self, member_id: str, class_id: str) -> tuple[dict, dict]:
        return self._get("members", member_id, "member"), self._get("classes", class_id, "class")

    find_member = find_by_field("members", "member_id", "Look a member up by full name.", "no member named '{name}'",
                                name="the member's full name.")

    @tool
    def list_classes(self, day: Annotated[Day, "Mon, Tue, Wed, Thu, Fri, Sat or Sun."]) -> list:
        """The classes of a weekday, by hour."""
        found = [{"class_id": cid, "name": c["name"], "hour": c["hour"], "spots_left": c["capacity"] -
                  len(c["attendees"])} for cid, c in self.classes.items() if c["day"] == day]
        return sorted(found, key=lambda c: c["hour"])

    @tool
    def book_class(self, member_id: Annotated[str, "the member."], class_id: Annotated[str, "the class."]) -> dict:
        """Book a member into a class; costs one credit."""
        member, cls = self._member_and_class(member_id, class_id)
        if member_id in cls["attendees"]:
            raise ToolError("already booked")
        if len(cls["attendees"]) >= cls["capacity"]:
            raise ToolError("the class is full")
        if member["credits"] < 1:
            raise ToolError("the member has no credits left")
        member["credits"] -= 1
        cls["attendees"].append(member_id)
        return {"class_id": class_id, "credits_left": member["credits"]}

    @tool
    def cancel_booking(self, member_id: Annotated[str, "the member."], class_id: Annotated[str, "the class."]) -> dict:
        """Take a member out of a class; the credit is refunded."""
        member, cls = self._member_and_class(member_id, class_id)
        if member_id not in cls["attendees"]:
            raise ToolError("the member is not booked into that class")
        cls["attendees"].remove(member_id)
        member["credits"] += 1
        return {"class_id": class_id, "credits_left": member["credits"]}

    @tool
    def add_credits(self, member_id: Annotated[str, "the member."],
                    credits: Annotated[int, "how many credits."]) -> dict:
        """Sell class credits to a member."""
        member = self._get("members", member_id, "member")
        return {"member_id": member_id, "credits": increase(member, "credits", credits, "credits")}

    @tool
    def change_plan(self, member_id: Annotated[str, "the member."],
                    plan: Annotated[Literal['basic', 'premium'], "basic or premium."]) -> dict:
        """Switch a member's plan."""
        return self._update("members", member_id, "member", plan=plan)


def _gym(pick: Pick) -> dict:
    members = {mid: {"name": n, "plan": pick.choice(("basic", "premium")), "credits": pick.randint(1, 10)}
               for mid, n in zip(pick.ids("GM", 6), pick.people(6))}
    classes = {}
    ids = iter(pick.ids("CL", 28, digits=3))
    for day in DAYS:
        for hour, name in zip(sorted(pick.sample(range(7, 21), 3)), pick.sample(CLASSES, 3)):
            classes[next(ids)] = {"name": name, "day": day, "hour": hour, "capacity": pick.randint(8, 20),
                                  "attendees": []}
    return {"members": members, "classes": classes, "next_id": pick.counter()}


def _day_classes(init: dict, day: str) -> list[str]:
    return sorted((cid for cid, c in init["classes"].items() if c["day"] == day),
                  key=lambda cid: init["classes"][cid]["hour"])


def book(pick: Pick) -> Draft:
    init = _gym(pick)
    mid, day = pick.choice(list(init["members"])), pick.choice(DAYS)
    index = pick.randrange(3)
    cid = _day_classes(init, day)[index]
    name, cls = init["members"][mid]["name"], init["classes"][cid]
    d = Draft(f"Book {name} into the {cls['name']} class on {DAY_NAMES[day]} at {cls['hour']}:00.", init)
    c0 = d.call("find_member", name=name)
    c1 = d.call("list_classes", day=day)
    d.call("book_class", member_id=ref(c0, "member_id"), class_id=ref(c1, index, "class_id"))
    return d.check(contains(("classes", cid, "attendees"), mid),
                   eq(("members", mid, "credits"), init["members"][mid]["credits"] - 1))


def top_up_and_book(pick: Pick) -> Draft:
    init = _gym(pick)
    mid, day, credits = pick.choice(list(init["members"])), pick.choice(DAYS), pick.choice((5, 10, 20))
    init["members"][mid]["credits"] = 0
    index = pick.randrange(3)
    cid = _day_classes(init, day)[index]
    name, cls = init["members"][mid]["name"], init["classes"][cid]
    d = Draft(f"{name} has no credits left. Sell them {credits} credits and book them into {cls['name']} on "
              f"{DAY_NAMES[day]}.", init)
    c0 = d.call("find_member", name=name)
    d.call("add_credits", member_id=ref(c0, "member_id"), credits=credits)
    c2 = d.call("list_classes", day=day)
    d.call("book_class", member_id=ref(c0, "member_id"), class_id=ref(c2, index, "class_id"))
    return d.check(contains(("classes", cid, "attendees"), mid), eq(("members", mid, "credits"), credits - 1))


def switch_class(pick: Pick) -> Draft:
    init = _gym(pick)
    mid, day = pick.choice(list(init["members"])), pick.choice(DAYS)
    old, new = pick.sample(range(3), 2)
    today = _day_classes(init, day)
    init["classes"][today[old]]["attendees"].append(mid)
    name = init["members"][mid]["name"]
    d = Draft(f"{name} wants to switch from {init['classes'][today[old]]['name']} to "
              f"{init['classes'][today[new]]['name']} on {DAY_NAMES[day]}.", init)
    c0 = d.call("find_member", name=name)
    c1 = d.call("list_classes", day=day)
    d.call("cancel_booking", member_id=ref(c0, "member_id"), class_id=ref(c1, old, "class_id"))
    d.call("book_class", member_id=ref(c0, "member_id"), class_id=ref(c1, new, "class_id"))
    return d.check(not_contains(("classes", today[old], "attendees"), mid),
                   contains(("classes", today[new], "attendees"), mid))


DOMAIN = Domain(
    name="gym", env_class=GymEnv,
    introduction="The front desk system of a fitness club with a weekly class timetable.",
    rules=("Each class booking costs one credit; cancelling refunds it.", "Classes have a capacity."),
    kinds=(book, top_up_and_book, switch_class),
)
