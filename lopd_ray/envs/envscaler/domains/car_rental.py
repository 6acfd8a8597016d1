"""A car rental branch network: cars by location and category, rentals with insurance and returns."""
from __future__ import annotations

from typing import Annotated, Literal

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, eq, increase, match, ref

Category = Literal["economy", "compact", "suv", "van"]
CITIES = ("Lisbon", "Porto", "Madrid", "Seville", "Lyon", "Nice", "Milan", "Turin", "Munich", "Vienna")
MODELS = {"economy": ("Fiat Panda", "Kia Picanto"), "compact": ("VW Golf", "Ford Focus"),
          "suv": ("Toyota RAV4", "Kia Sportage"), "van": ("Ford Transit", "Renault Trafic")}
LABELS = {"economy": "economy car", "compact": "compact car", "suv": "SUV", "van": "van"}


class CarRentalEnv(DomainEnv):
    def _active(self, rental_id: str) -> dict:
        return self._get_in_state("rentals", rental_id, "rental", "the rental is closed", status="active")

    @tool
    def search_cars(self, location: Annotated[str, "the city."],
                    category: Annotated[Category, "economy, compact, suv or van."]) -> list:
        """Available cars of a category at a location, cheapest first."""
        found = [{"car_id": cid, "model": c["model"], "daily_rate": c["daily_rate"]} for cid, c in self.cars.items()
                 if c["location"] == location and c["category"] == category and c["available"]]
        return sorted(found, key=lambda c: (c["daily_rate"], c["car_id"]))

    @tool
    def rent_car(self, car_id: Annotated[str, "the car."], customer_name: Annotated[str, "the customer's full name."],
                 days: Annotated[int, "rental length in days."]) -> dict:
        """Rent an available car to a customer."""
        car = self._get("cars", car_id, "car")
        if not car["available"] or days < 1:
            raise ToolError("the car is not available, or days is below 1")
        car["available"] = False
        rental_id = self._insert("rentals", "RN", {"car_id": car_id, "customer": customer_name, "days": days,
                                                   "insurance": False, "status": "active"})
        return {"rental_id": rental_id, "total": car["daily_rate"] * days}

    @tool
    def add_insurance(self, rental_id: Annotated[str, "the rental."]) -> dict:
        """Add full insurance to an active rental."""
        self._active(rental_id)["insurance"] = True
        return {"rental_id": rental_id, "insurance": True}

    @tool
    def find_rentals(self, customer_name: Annotated[str, "the customer's full name."]) -> list:
        """A customer's active rentals."""
        return [{**r, "model": self.cars[r["car_id"]]["model"]}
                for r in self._select("rentals", "rental_id", customer=customer_name, status="active")]

    @tool
    def extend_rental(self, rental_id: Annotated[str, "the rental."],
                      extra_days: Annotated[int, "days to add."]) -> dict:
        """Add days to an active rental."""
        return {"rental_id": rental_id, "days": increase(self._active(rental_id), "days", extra_days, "extra_days")}

    @tool
    def return_car(self, rental_id: Annotated[str, "the rental."],
                   location: Annotated[str, "the city where the car was dropped off."]) -> dict:
        """Close a rental; the car stays where it was dropped off."""
        rental = self._active(rental_id)
        if location not in self.branches:
            raise ToolError(f"no branch in '{location}'")
        rental["status"] = "returned"
        self.cars[rental["car_id"]].update(available=True, location=location)
        return {"rental_id": rental_id, "status": "returned"}


def _fleet(pick: Pick) -> dict:
    branches = pick.sample(CITIES, 3)
    cars = {}
    for cid in pick.ids("CAR", 18, digits=3):
        category = pick.choice(sorted(MODELS))
        cars[cid] = {"model": pick.choice(MODELS[category]), "category": category, "location": pick.choice(branches),
                     "daily_rate": pick.randint(25, 140), "available": pick.random() < 0.8}
    return {"branches": branches, "cars": cars, "rentals": {}, "next_id": pick.counter()}


def rent_insured(pick: Pick) -> Draft:
    init = _fleet(pick)
    cid, car = pick.choice(list(init["cars"].items()))
    car["available"], car["daily_rate"] = True, 19  # the cheapest of its kind there
    customer, days = pick.people(1)[0], pick.randint(2, 14)
    d = Draft(f"Rent the cheapest available {LABELS[car['category']]} in {car['location']} to {customer} for "
              f"{days} days, with full insurance.", init)
    c0 = d.call("search_cars", location=car["location"], category=car["category"])
    c1 = d.call("rent_car", car_id=ref(c0, 0, "car_id"), customer_name=customer, days=days)
    d.call("add_insurance", rental_id=ref(c1, "rental_id"))
    return d.check(match("rentals", {"car_id": cid, "customer": customer, "days": days, "status": "active"}),
                   match("rentals", {"customer": customer, "insurance": True}), eq(("cars", cid, "available"), False))


def _renting(pick: Pick) -> tuple[dict, str, str, str]:
    init = _fleet(pick)
    cid = pick.choice(list(init["cars"]))
    init["cars"][cid]["available"] = False
    customer, rid = pick.people(1)[0], pick.ids("RN", 1, digits=3)[0]
    init["rentals"][rid] = {"car_id": cid, "customer": customer, "days": pick.randint(1, 7), "insurance": False,
                            "status": "active"}
    return init, cid, customer, rid


def return_elsewhere(pick: Pick) -> Draft:
    init, cid, customer, rid = _renting(pick)
    city = pick.choice([b for b in init["branches"] if b != init["cars"][cid]["location"]])
    d = Draft(f"{customer} has dropped their rental car off in {city}. Close the rental.", init)
    c0 = d.call("find_rentals", customer_name=customer)
    d.call("return_car", rental_id=ref(c0, 0, "rental_id"), location=city)
    return d.check(eq(("rentals", rid, "status"), "returned"), eq(("cars", cid, "location"), city))


def extend(pick: Pick) -> Draft:
    init, _, customer, rid = _renting(pick)
    extra = pick.randint(1, 5)
    d = Draft(f"{customer} needs their rental car {extra} day(s) longer. Extend the rental.", init)
    c0 = d.call("find_rentals", customer_name=customer)
    d.call("extend_rental", rental_id=ref(c0, 0, "rental_id"), extra_days=extra)
    return d.check(eq(("rentals", rid, "days"), init["rentals"][rid]["days"] + extra))


DOMAIN = Domain(
    name="car_rental", env_class=CarRentalEnv,
    introduction="The booking system of a car rental company with branches in several cities.",
    rules=("A car is rented to one customer at a time.", "Cars can be dropped off at any branch."),
    kinds=(rent_insured, return_elsewhere, extend),
)
