"""An airline reservation desk: flights with seats, bookings by passenger."""
from __future__ import annotations

from typing import Annotated

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, eq, match, ref

AIRPORTS = ("AMS", "ATL", "BCN", "BOS", "CDG", "DEN", "DXB", "FRA", "HND", "JFK", "LAX", "LHR", "MAD", "ORD", "SEA",
            "SFO", "SIN", "YYZ")


class FlightsEnv(DomainEnv):
    @tool
    def search_flights(self, origin: Annotated[str, "departure airport code, e.g. JFK."],
                       destination: Annotated[str, "arrival airport code."],
                       date: Annotated[str, "the day, YYYY-MM-DD."]) -> list:
        """Flights on a route and day that still have seats."""
        return [{"flight_id": fid, "departure_hour": f["departure_hour"], "price": f["price"],
                 "seats_left": f["seats_left"]}
                for fid, f in self.flights.items()
                if (f["origin"], f["destination"], f["date"]) == (origin, destination, date) and f["seats_left"] > 0]

    @tool
    def book_flight(self, flight_id: Annotated[str, "the flight."],
                    passenger_name: Annotated[str, "the passenger's full name."]) -> dict:
        """Book a seat for a passenger."""
        flight = self._get("flights", flight_id, "flight")
        if flight["seats_left"] < 1:
            raise ToolError("the flight is full")
        flight["seats_left"] -= 1
        booking = {"flight_id": flight_id, "passenger": passenger_name, "status": "confirmed"}
        return {"booking_id": self._insert("bookings", "BK", booking), "price": flight["price"]}

    @tool
    def find_bookings(self, passenger_name: Annotated[str, "the passenger's full name."]) -> list:
        """A passenger's confirmed bookings, by date."""
        found = [{"booking_id": bid, "flight_id": b["flight_id"], **{k: self.flights[b["flight_id"]][k]
                                                                      for k in ("origin", "destination", "date")}}
                 for bid, b in self.bookings.items() if b["passenger"] == passenger_name and b["status"] == "confirmed"]
        return sorted(found, key=lambda b: b["date"])

    @tool
    def change_flight(self, booking_id: Annotated[str, "the booking."],
                      new_flight_id: Annotated[str, "the flight to move to."]) -> dict:
        """Move a booking to another flight on the same route."""
        booking = self._get("bookings", booking_id, "booking")
        new, old = self._get("flights", new_flight_id, "flight"), self.flights[booking["flight_id"]]
        if booking["status"] != "confirmed":
            raise ToolError("only confirmed bookings can be changed")
        if (new["origin"], new["destination"]) != (old["origin"], old["destination"]):
            raise ToolError("the new flight must fly the same route")
        if new["seats_left"] < 1:
            raise ToolError("the new flight is full")
        new["seats_left"] -= 1
        old["seats_left"] += 1
        booking["flight_id"] = new_flight_id
        return {"booking_id": booking_id, "flight_id": new_flight_id}

    @tool
    def cancel_booking(self, booking_id: Annotated[str, "the booking."]) -> dict:
        """Cancel a booking and free its seat."""
        booking = self._get_in_state("bookings", booking_id, "booking", "the booking is already cancelled",
                                     status="confirmed")
        booking["status"] = "cancelled"
        self.flights[booking["flight_id"]]["seats_left"] += 1
        return {"booking_id": booking_id, "status": "cancelled"}


def _flights(pick: Pick) -> tuple[dict, list[tuple[str, str]], list[str]]:
    """Every route flies once a day on each of the dates."""
    ports = pick.sample(AIRPORTS, 6)
    routes = [(ports[0], ports[1]), (ports[2], ports[3]), (ports[4], ports[5])]
    dates = pick.dates(3)
    flights = {}
    ids = iter(pick.ids("FL", len(routes) * len(dates), digits=3))
    for origin, destination in routes:
        for date in dates:
            flights[next(ids)] = {"origin": origin, "destination": destination, "date": date,
                                  "departure_hour": pick.randint(6, 21), "price": pick.randint(90, 900),
                                  "seats_left": pick.randint(2, 40)}
    return {"flights": flights, "bookings": {}, "next_id": pick.counter()}, routes, dates


def _flight(init: dict, route: tuple, date: str) -> str:
    return next(fid for fid, f in init["flights"].items() if (f["origin"], f["destination"], f["date"]) ==
                (*route, date))


def book(pick: Pick) -> Draft:
    init, routes, dates = _flights(pick)
    route, date, passenger = pick.choice(routes), pick.choice(dates), pick.people(1)[0]
    fid = _flight(init, route, date)
    d = Draft(f"Book {passenger} on the flight from {route[0]} to {route[1]} on {date}.", init)
    c0 = d.call("search_flights", origin=route[0], destination=route[1], date=date)
    d.call("book_flight", flight_id=ref(c0, 0, "flight_id"), passenger_name=passenger)
    return d.check(match("bookings", {"flight_id": fid, "passenger": passenger, "status": "confirmed"}),
                   eq(("flights", fid, "seats_left"), init["flights"][fid]["seats_left"] - 1))


def _with_bookings(pick: Pick) -> tuple[dict, str, list[tuple[str, str]], list[str], list[str]]:
    """A passenger holding bookings on two different routes (listed by date: first, second)."""
    init, routes, dates = _flights(pick)
    passenger = pick.people(1)[0]
    booked = [_flight(init, routes[0], dates[0]), _flight(init, routes[1], dates[1])]
    for bid, fid in zip(pick.ids("BK", 2, digits=3), booked):
        init["bookings"][bid] = {"flight_id": fid, "passenger": passenger, "status": "confirmed"}
    return init, passenger, routes, dates, list(init["bookings"])


def change(pick: Pick) -> Draft:
    init, passenger, routes, dates, bookings = _with_bookings(pick)
    index = pick.randrange(2)
    route, old_date = routes[index], dates[index]
    new_date = pick.choice([d for d in dates if d != old_date])
    new_fid = _flight(init, route, new_date)
    d = Draft(f"{passenger} wants to move their {route[0]}-{route[1]} booking from {old_date} to the flight on "
              f"{new_date}.", init)
    c0 = d.call("find_bookings", passenger_name=passenger)
    c1 = d.call("search_flights", origin=route[0], destination=route[1], date=new_date)
    d.call("change_flight", booking_id=ref(c0, index, "booking_id"), new_flight_id=ref(c1, 0, "flight_id"))
    return d.check(eq(("bookings", bookings[index], "flight_id"), new_fid),
                   eq(("flights", new_fid, "seats_left"), init["flights"][new_fid]["seats_left"] - 1))


def cancel(pick: Pick) -> Draft:
    init, passenger, routes, _, bookings = _with_bookings(pick)
    index = pick.randrange(2)
    fid = init["bookings"][bookings[index]]["flight_id"]
    d = Draft(f"Cancel {passenger}'s booking from {routes[index][0]} to {routes[index][1]}.", init)
    c0 = d.call("find_bookings", passenger_name=passenger)
    d.call("cancel_booking", booking_id=ref(c0, index, "booking_id"))
    return d.check(eq(("bookings", bookings[index], "status"), "cancelled"),
                   eq(("flights", fid, "seats_left"), init["flights"][fid]["seats_left"] + 1))


DOMAIN = Domain(
    name="flights", env_class=FlightsEnv,
    introduction="An airline's reservation system.",
    rules=("A booking can only be changed to a flight on the same route.", "Cancelling frees the seat."),
    kinds=(book, change, cancel),
)
