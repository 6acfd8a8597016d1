"""A lending library: books with copies, members, loans and reservations."""
from __future__ import annotations

from typing import Annotated

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, contains, eq, match, ref

NOUNS = ("River", "Garden", "Lantern", "Voyage", "Archive", "Compass", "Mirror", "Orchard", "Signal", "Harvest")


class LibraryEnv(DomainEnv):
    @tool
    def search_books(self, title_contains: Annotated[str, "part of the title."]) -> list:
        """Find books whose title contains a text (case-insensitive)."""
        text = title_contains.lower()
        return [{"book_id": bid, "title": b["title"], "author": b["author"], "copies_available": b["copies"]}
                for bid, b in self.books.items() if text in b["title"].lower()]

    @tool
    def find_member(self, name: Annotated[str, "the member's full name."]) -> dict:
        """Look a library member up by full name."""
        member_id, _ = self._find("members", f"no member named '{name}'", name=name)
        return {"member_id": member_id, "name": name}

    @tool
    def checkout_book(self, member_id: Annotated[str, "the member borrowing the book."],
                      book_id: Annotated[str, "the book to lend."]) -> dict:
        """Lend a copy of a book to a member."""
        self._get("members", member_id, "member")
        book = self._get("books", book_id, "book")
        if book["copies"] < 1:
            raise ToolError("no copy available; reserve the book instead")
        book["copies"] -= 1
        return {"loan_id": self._insert("loans", "LN", {"book_id": book_id, "member_id": member_id, "returned": False})}

    @tool
    def list_loans(self, member_id: Annotated[str, "the member."]) -> list:
        """The loans a member has not returned yet."""
        self._get("members", member_id, "member")
        return [{"loan_id": lid, "book_id": l["book_id"], "title": self.books[l["book_id"]]["title"]}
                for lid, l in self.loans.items() if l["member_id"] == member_id and not l["returned"]]

    @tool
    def return_book(self, loan_id: Annotated[str, "the loan to close."]) -> dict:
        """Record that a lent book came back."""
        loan = self._get_in_state("loans", loan_id, "loan", "this loan is already closed", returned=False)
        loan["returned"] = True
        self.books[loan["book_id"]]["copies"] += 1
        return {"loan_id": loan_id, "returned": True}

    @tool
    def reserve_book(self, member_id: Annotated[str, "the member."], book_id: Annotated[str, "the book."]) -> dict:
        """Put a member on the waiting list of a book that has no copy available."""
        self._get("members", member_id, "member")
        if self._get("books", book_id, "book")["copies"] > 0:
            raise ToolError("a copy is available; check it out instead")
        entry = {"member_id": member_id, "book_id": book_id}
        if entry in self.reservations:
            raise ToolError("already reserved")
        self.reservations.append(entry)
        return {"position": sum(r["book_id"] == book_id for r in self.reservations)}


def _library(pick: Pick) -> dict:
    titles = [f"The {w.capitalize()} {n}" for w, n in zip(pick.words(8), pick.sample(NOUNS, 8))]
    authors = pick.people(8)
    books = {bid: {"title": t, "author": a, "copies": pick.randint(1, 4)}
             for bid, t, a in zip(pick.ids("BK", 8), titles, authors)}
    members = {mid: {"name": n} for mid, n in zip(pick.ids("M", 6), pick.people(6))}
    return {"books": books, "members": members, "loans": {}, "reservations": [], "next_id": pick.counter()}


def _book_and_member(pick: Pick) -> tuple[dict, str, str]:
    """A library, and a book and a member picked from it."""
    init = _library(pick)
    return init, pick.choice(list(init["books"])), pick.choice(list(init["members"]))


def _call_with_book_and_member(d: Draft, tool_name: str, title: str, name: str) -> None:
    """Oracle calls: look the book up by title and the member by name, then pass both ids to `tool_name`."""
    c0 = d.call("search_books", title_contains=title)
    c1 = d.call("find_member", name=name)
    d.call(tool_name, member_id=ref(c1, "member_id"), book_id=ref(c0, 0, "book_id"))


def checkout(pick: Pick) -> Draft:
    init, bid, mid = _book_and_member(pick)
    title, name = init["books"][bid]["title"], init["members"][mid]["name"]
    d = Draft(f"Check out '{title}' for library member {name}.", init)
    _call_with_book_and_member(d, "checkout_book", title, name)
    return d.check(match("loans", {"book_id": bid, "member_id": mid, "returned": False}),
                   eq(("books", bid, "copies"), init["books"][bid]["copies"] - 1))


def process_return(pick: Pick) -> Draft:
    init = _library(pick)
    mid = pick.choice(list(init["members"]))
    borrowed = pick.sample(list(init["books"]), 2)
    loan_ids = pick.ids("LN", 2, digits=3)
    for lid, bid in zip(loan_ids, borrowed):
        init["loans"][lid] = {"book_id": bid, "member_id": mid, "returned": False}
    index = pick.randrange(2)
    bid, lid = borrowed[index], loan_ids[index]
    title, name = init["books"][bid]["title"], init["members"][mid]["name"]
    d = Draft(f"{name} is returning '{title}'. Process the return.", init)
    c0 = d.call("find_member", name=name)
    c1 = d.call("list_loans", member_id=ref(c0, "member_id"))
    d.call("return_book", loan_id=ref(c1, index, "loan_id"))
    return d.check(eq(("loans", lid, "returned"), True),
                   eq(("books", bid, "copies"), init["books"][bid]["copies"] + 1))


def reserve(pick: Pick) -> Draft:
    init, bid, mid = _book_and_member(pick)
    init["books"][bid]["copies"] = 0
    title, name = init["books"][bid]["title"], init["members"][mid]["name"]
    d = Draft(f"{name} wants '{title}', which is out of copies. Put them on the book's waiting list.", init)
    _call_with_book_and_member(d, "reserve_book", title, name)
    return d.check(contains("reservations", {"member_id": mid, "book_id": bid}))


DOMAIN = Domain(
    name="library", env_class=LibraryEnv,
    introduction="The circulation desk of a public library.",
    rules=("A book can be lent only while a copy is available.",
           "A book can be reserved only while no copy is available."),
    kinds=(checkout, process_return, reserve),
)
