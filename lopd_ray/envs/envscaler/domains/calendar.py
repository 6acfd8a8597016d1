"""A work calendar: events with attendees, contacts."""
from __future__ import annotations

from typing import Annotated

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, absent, append_once, delete_record, eq,
                                                 find_by_field, has, match, parse_date, ref)

TITLES = ("Budget review", "Design sync", "Hiring panel", "Quarterly planning", "Customer call", "Retro",
          "Roadmap workshop", "Security briefing", "Vendor demo", "Team lunch", "Offsite prep", "Launch check")


class CalendarEnv(DomainEnv):
    def _free(self, date: str, start: int, duration: int, ignore: str = "") -> None:
        if not (0 <= start and start + duration <= 24 and duration >= 1):
            raise ToolError("an event must start at or after hour 0, last at least an hour and end by hour 24")
        for eid, e in self.events.items():
            if eid != ignore and e["date"] == date and start < e["start_hour"] + e["duration_hours"] \
                    and e["start_hour"] < start + duration:
                raise ToolError(f"conflicts with '{e['title']}' ({eid})")

    @tool
    def list_events(self, date: Annotated[str, "the day, YYYY-MM-DD."]) -> list:
        """The events of one day, by start hour."""
        parse_date(date)
        return sorted(self._select("events", "event_id", date=date), key=lambda e: e["start_hour"])

    @tool
    def create_event(self, title: Annotated[str, "the event title."], date: Annotated[str, "the day, YYYY-MM-DD."],
                     start_hour: Annotated[int, "start hour, 0-23."],
                     duration_hours: Annotated[int, "length in whole hours."]) -> dict:
        """Create an event."""
        parse_date(date)
        self._free(date, start_hour, duration_hours)
        return {"event_id": self._insert("events", "EV", {"title": title, "date": date, "start_hour": start_hour,
                                                          "duration_hours": duration_hours, "attendees": []})}

    find_contact = find_by_field("contacts", None, "Look a colleague's email address up by full name.",
                                 "no contact named '{name}'", name="the colleague's full name.")

    @tool
    def add_attendee(self, event_id: Annotated[str, "the event."],
                     email: Annotated[str, "the invitee's email address."]) -> dict:
        """Invite someone to an event."""
        event = self._get("events", event_id, "event")
        if email not in [c["email"] for c in self.contacts.values()]:
            raise ToolError(f"'{email}' is not a known contact address")
        return {"event_id": event_id, "attendees": append_once(event["attendees"], email)}

    @tool
    def reschedule_event(self, event_id: Annotated[str, "the event."], date: Annotated[str, "the new day, YYYY-MM-DD."],
                         start_hour: Annotated[int, "the new start hour."]) -> dict:
        """Move an event to another day and/or hour, keeping its length."""
        event = self._get("events", event_id, "event")
        parse_date(date)
        self._free(date, start_hour, event["duration_hours"], ignore=event_id)
        event.update(date=date, start_hour=start_hour)
        return {"event_id": event_id, "date": date, "start_hour": start_hour}

    cancel_event = delete_record("events", "event", "Delete an event.", "the event.", "cancelled")


def _calendar(pick: Pick, busy_dates: list[str]) -> dict:
    """Events on `busy_dates` only (2-3 a day, non-overlapping), and six contacts."""
    events = {}
    ids = iter(pick.ids("EV", 12))
    titles = iter(pick.sample(TITLES, 12))
    for date in busy_dates:
        for start in sorted(pick.sample((8, 10, 13, 15), pick.randint(2, 3))):
            events[next(ids)] = {"title": next(titles), "date": date, "start_hour": start, "duration_hours": 1,
                                 "attendees": []}
    people = pick.people(6)
    contacts = {cid: {"name": n, "email": f"{n.split()[0].lower()}.{n.split()[1].lower()}@corp.example"}
                for cid, n in zip(pick.ids("C", 6), people)}
    return {"events": events, "contacts": contacts, "next_id": pick.counter()}


def schedule_and_invite(pick: Pick) -> Draft:
    busy, free = pick.dates(2)[0], pick.dates(1, month=7)[0]
    init = _calendar(pick, [busy])
    used = {e["title"] for e in init["events"].values()}
    title = pick.choice([t for t in TITLES if t not in used])
    start, duration = pick.randint(9, 15), pick.randint(1, 2)
    contact = pick.choice(list(init["contacts"].values()))
    d = Draft(f"Schedule '{title}' on {free} from {start}:00 for {duration} hour(s) and invite {contact['name']}.",
              init)
    c0 = d.call("create_event", title=title, date=free, start_hour=start, duration_hours=duration)
    c1 = d.call("find_contact", name=contact["name"])
    d.call("add_attendee", event_id=ref(c0, "event_id"), email=ref(c1, "email"))
    return d.check(match("events", {"title": title, "date": free, "start_hour": start, "duration_hours": duration}),
                   match("events", {"title": title, "attendees": has(contact["email"])}))


def move_event(pick: Pick) -> Draft:
    day, other = pick.dates(2)
    init = _calendar(pick, [day])
    listed = sorted(init["events"].items(), key=lambda kv: kv[1]["start_hour"])
    index = pick.randrange(len(listed))
    eid, event = listed[index]
    hour = pick.choice([h for h in (9, 11, 14, 16) if h != event["start_hour"]])
    d = Draft(f"Move '{event['title']}' on {day} to {other} at {hour}:00.", init)
    c0 = d.call("list_events", date=day)
    d.call("reschedule_event", event_id=ref(c0, index, "event_id"), date=other, start_hour=hour)
    return d.check(eq(("events", eid, "date"), other), eq(("events", eid, "start_hour"), hour))


def clear_day(pick: Pick) -> Draft:
    day, keep = pick.dates(2)
    init = _calendar(pick, [day, keep])
    doomed = [eid for eid, e in sorted(init["events"].items(), key=lambda kv: kv[1]["start_hour"])
              if e["date"] == day]
    d = Draft(f"Something came up: cancel every event on {day}.", init)
    c0 = d.call("list_events", date=day)
    for i in range(len(doomed)):
        d.call("cancel_event", event_id=ref(c0, i, "event_id"))
    return d.check(*(absent(("events", eid)) for eid in doomed))


DOMAIN = Domain(
    name="calendar", env_class=CalendarEnv,
    introduction="A shared work calendar with a company contact directory.",
    rules=("Events on the same day must not overlap.", "Only directory contacts can be invited."),
    kinds=(schedule_and_invite, move_event, clear_day),
)
