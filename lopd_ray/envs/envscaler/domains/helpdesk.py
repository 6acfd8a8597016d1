"""A support helpdesk: customer tickets with priorities, assignees and comments."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, contains, eq, find_by_field, match, ref

Priority = Literal["low", "normal", "high", "urgent"]
Status = Literal["open", "closed"]
COMPANIES = ("Acme Corp", "Globex", "Initech", "Umbrella Ltd", "Hooli", "Stark Industries", "Wayne Enterprises",
             "Soylent", "Tyrell", "Cyberdyne", "Wonka", "Gringotts")
ISSUES = ("Login fails after password reset", "Invoice shows wrong VAT", "Export to CSV times out",
          "Mobile app crashes on start", "Webhook retries flood our server", "SSO certificate expired",
          "Dashboard loads slowly", "Missing data after migration", "API returns 500 on search",
          "Cannot add new users", "Password emails never arrive", "Report totals do not match",
          "Two-factor codes rejected", "Billing page shows old plan")
COMMENTS = ("Fixed in release 4.2, please confirm.", "Root cause found and patched.",
            "Customer confirmed the workaround.", "Duplicate of an earlier ticket, resolved there.")


class HelpdeskEnv(DomainEnv):
    @tool
    def search_tickets(self, customer: Annotated[str, "the customer company."],
                       status: Annotated[Optional[Status], "open or closed."] = None) -> list:
        """A customer's tickets, optionally only open or only closed ones."""
        return self._select("tickets", "ticket_id", customer=customer, status=status)

    @tool
    def create_ticket(self, customer: Annotated[str, "the customer company."],
                      title: Annotated[str, "a one-line summary."],
                      priority: Annotated[Priority, "low, normal, high or urgent."]) -> dict:
        """Open a new ticket."""
        ticket = {"customer": customer, "title": title, "priority": priority, "status": "open", "assignee": None,
                  "comments": []}
        return {"ticket_id": self._insert("tickets", "TK", ticket)}

    find_agent = find_by_field("agents", "agent_id", "Look a support agent up by full name.", "no agent named '{name}'",
                               name="the agent's full name.")

    @tool
    def assign_ticket(self, ticket_id: Annotated[str, "the ticket."], agent_id: Annotated[str, "the agent."]) -> dict:
        """Assign a ticket to an agent."""
        ticket = self._get("tickets", ticket_id, "ticket")
        self._get("agents", agent_id, "agent")
        ticket["assignee"] = agent_id
        return {"ticket_id": ticket_id, "assignee": agent_id}

    @tool
    def set_priority(self, ticket_id: Annotated[str, "the ticket."],
                     priority: Annotated[Priority, "low, normal, high or urgent."]) -> dict:
        """Change the priority of a ticket."""
        return self._update("tickets", ticket_id, "ticket", priority=priority)

    @tool
    def add_comment(self, ticket_id: Annotated[str, "the ticket."], text: Annotated[str, "the comment."]) -> dict:
        """Add a comment to a ticket."""
        self._get("tickets", ticket_id, "ticket")["comments"].append(text)
        return {"ticket_id": ticket_id}

    @tool
    def close_ticket(self, ticket_id: Annotated[str, "the ticket."]) -> dict:
        """Close a ticket; it needs at least one comment explaining the resolution."""
        ticket = self._get("tickets", ticket_id, "ticket")
        if not ticket["comments"]:
            raise ToolError("add a comment explaining the resolution first")
        ticket["status"] = "closed"
        return {"ticket_id": ticket_id, "status": "closed"}


def _desk(pick: Pick) -> dict:
    agents = {aid: {"name": n, "team": pick.choice(("billing", "platform", "mobile"))}
              for aid, n in zip(pick.ids("AG", 5, digits=3), pick.people(5))}
    customers = pick.sample(COMPANIES, 5)
    tickets = {}
    for customer, tids in zip(customers, [pick.ids("TK", 2, digits=3) for _ in customers]):
        for tid, status in zip(tids, ("open", "closed")):
            tickets[tid] = {"customer": customer, "title": pick.choice(ISSUES), "priority": "normal",
                            "status": status, "assignee": None, "comments": [] if status == "open" else ["Solved."]}
    return {"agents": agents, "customers": customers, "tickets": tickets, "next_id": pick.counter()}


def _open_ticket(init: dict, customer: str) -> str:
    return next(t for t, v in init["tickets"].items() if v["customer"] == customer and v["status"] == "open")


def open_and_assign(pick: Pick) -> Draft:
    init = _desk(pick)
    used = {t["title"] for t in init["tickets"].values()}
    customer, title = pick.choice(init["customers"]), pick.choice([i for i in ISSUES if i not in used])
    priority = pick.choice(("low", "normal", "high", "urgent"))
    aid, agent = pick.choice(list(init["agents"].items()))
    article = "an" if priority == "urgent" else "a"
    d = Draft(f"Open {article} {priority}-priority ticket for {customer} titled '{title}' and assign it to "
              f"{agent['name']}.", init)
    c0 = d.call("create_ticket", customer=customer, title=title, priority=priority)
    c1 = d.call("find_agent", name=agent["name"])
    d.call("assign_ticket", ticket_id=ref(c0, "ticket_id"), agent_id=ref(c1, "agent_id"))
    ticket = {"customer": customer, "title": title}
    return d.check(match("tickets", {**ticket, "priority": priority}), match("tickets", {**ticket, "assignee": aid}))


def resolve(pick: Pick) -> Draft:
    init = _desk(pick)
    customer, comment = pick.choice(init["customers"]), pick.choice(COMMENTS)
    tid = _open_ticket(init, customer)
    d = Draft(f"Close {customer}'s open ticket, with the comment '{comment}'.", init)
    c0 = d.call("search_tickets", customer=customer, status="open")
    d.call("add_comment", ticket_id=ref(c0, 0, "ticket_id"), text=comment)
    d.call("close_ticket", ticket_id=ref(c0, 0, "ticket_id"))
    return d.check(contains(("tickets", tid, "comments"), comment), eq(("tickets", tid, "status"), "closed"))


def escalate(pick: Pick) -> Draft:
    init = _desk(pick)
    customer = pick.choice(init["customers"])
    tid = _open_ticket(init, customer)
    aid, agent = pick.choice(list(init["agents"].items()))
    d = Draft(f"Escalate {customer}'s open ticket to urgent and assign it to {agent['name']}.", init)
    c0 = d.call("search_tickets", customer=customer, status="open")
    d.call("set_priority", ticket_id=ref(c0, 0, "ticket_id"), priority="urgent")
    c2 = d.call("find_agent", name=agent["name"])
    d.call("assign_ticket", ticket_id=ref(c0, 0, "ticket_id"), agent_id=ref(c2, "agent_id"))
    return d.check(eq(("tickets", tid, "priority"), "urgent"), eq(("tickets", tid, "assignee"), aid))


DOMAIN = Domain(
    name="helpdesk", env_class=HelpdeskEnv,
    introduction="The ticketing system of a software company's customer support team.",
    rules=("A ticket is closed only with a comment explaining the resolution.",),
    kinds=(open_and_assign, resolve, escalate),
)
