"""A warehouse: stock levels, bin locations, purchase orders."""
from __future__ import annotations

from typing import Annotated

import re

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, at_least_one, eq, find_by_field, match,
                                                 ref)

PRODUCTS = ("hex bolts", "wood screws", "cable ties", "duct tape", "work gloves", "safety goggles", "paint rollers",
            "sandpaper", "zip bags", "pallet wrap", "box cutters", "label rolls", "packing foam", "hinges")


def _location(pick: Pick) -> str:
    return f"{pick.choice('ABCDEF')}-{pick.randint(1, 40):02d}"


class WarehouseEnv(DomainEnv):
    find_item = find_by_field("items", "sku", "Look a stocked item up by name.", "no item named '{name}'",
                              name="the item name.")

    @tool
    def list_low_stock(self, threshold: Annotated[int, "the unit count."]) -> list:
        """Items with fewer units in stock than a threshold."""
        return [{"sku": sku, **item} for sku, item in self.items.items() if item["quantity"] < threshold]

    @tool
    def create_purchase_order(self, sku: Annotated[str, "the item."],
                              quantity: Annotated[int, "units to order."]) -> dict:
        """Order units of an item from its supplier."""
        self._get("items", sku, "item")
        at_least_one(quantity, "quantity")
        return {"po_id": self._insert("purchase_orders", "PO", {"sku": sku, "quantity": quantity, "status": "open"}),
                "status": "open"}

    @tool
    def receive_purchase_order(self, po_id: Annotated[str, "the purchase order."]) -> dict:
        """Record the delivery of a purchase order; its units are added to stock."""
        po = self._get("purchase_orders", po_id, "purchase order")
        if po["status"] != "open":
            raise ToolError(f"purchase order is {po['status']}")
        po["status"] = "received"
        self.items[po["sku"]]["quantity"] += po["quantity"]
        return {"po_id": po_id, "status": "received", "quantity_in_stock": self.items[po["sku"]]["quantity"]}

    @tool
    def move_item(self, sku: Annotated[str, "the item."], location: Annotated[str, "the bin, like B-07."]) -> dict:
        """Move an item to another bin."""
        item = self._get("items", sku, "item")
        if not re.fullmatch(r"[A-F]-\d{2}", location):
            raise ToolError("a location is an aisle A-F, a dash and two digits, like B-07")
        item["location"] = location
        return {"sku": sku, "location": location}

    @tool
    def adjust_stock(self, sku: Annotated[str, "the item."],
                     delta: Annotated[int, "units to add (negative to remove)."],
                     reason: Annotated[str, "why, e.g. damaged or recount."]) -> dict:
        """Correct the stock count of an item."""
        item = self._get("items", sku, "item")
        if item["quantity"] + delta < 0:
            raise ToolError("stock cannot go below zero")
        item["quantity"] += delta
        self.adjustments.append({"sku": sku, "delta": delta, "reason": reason})
        return {"sku": sku, "quantity": item["quantity"]}


def _warehouse(pick: Pick, low: int = 0, threshold: int = 20) -> dict:
    names = pick.sample(PRODUCTS, 7)
    quantities = [pick.randint(1, threshold - 1) for _ in range(low)] + \
                 [pick.randint(threshold, 300) for _ in range(7 - low)]
    pick.shuffle(quantities)
    items = {sku: {"name": n, "quantity": q, "location": _location(pick)}
             for sku, n, q in zip(pick.ids("SKU", 7), names, quantities)}
    return {"items": items, "purchase_orders": {}, "adjustments": [], "next_id": pick.counter()}


def restock(pick: Pick) -> Draft:
    init = _warehouse(pick)
    sku = pick.choice(list(init["items"]))
    item, n = init["items"][sku], pick.randint(10, 200)
    d = Draft(f"Order {n} more units of {item['name']} from the supplier, then record the delivery as received.",
              init)
    c0 = d.call("find_item", name=item["name"])
    c1 = d.call("create_purchase_order", sku=ref(c0, "sku"), quantity=n)
    d.call("receive_purchase_order", po_id=ref(c1, "po_id"))
    return d.check(eq(("items", sku, "quantity"), item["quantity"] + n),
                   match("purchase_orders", {"sku": sku, "quantity": n, "status": "received"}))


def relocate_and_write_off(pick: Pick) -> Draft:
    init = _warehouse(pick)
    sku = pick.choice([s for s, i in init["items"].items() if i["quantity"] > 5])
    item = init["items"][sku]
    location = next(loc for loc in iter(lambda: _location(pick), None) if loc != item["location"])
    damaged = pick.randint(1, 5)
    d = Draft(f"Move the {item['name']} to bin {location} and write off {damaged} damaged units.", init)
    c0 = d.call("find_item", name=item["name"])
    d.call("move_item", sku=ref(c0, "sku"), location=location)
    d.call("adjust_stock", sku=ref(c0, "sku"), delta=-damaged, reason="damaged")
    return d.check(eq(("items", sku, "location"), location), eq(("items", sku, "quantity"), item["quantity"] - damaged))


def reorder_low_stock(pick: Pick) -> Draft:
    threshold = pick.choice((15, 20, 25))
    init = _warehouse(pick, low=pick.randint(2, 3), threshold=threshold)
    low = [sku for sku, i in init["items"].items() if i["quantity"] < threshold]
    n = pick.choice((50, 100, 150))
    d = Draft(f"Every item with fewer than {threshold} units in stock needs a purchase order for {n} units. "
              f"Create those orders (leave them open).", init)
    c0 = d.call("list_low_stock", threshold=threshold)
    for i in range(len(low)):
        d.call("create_purchase_order", sku=ref(c0, i, "sku"), quantity=n)
    return d.check(*(match("purchase_orders", {"sku": sku, "quantity": n, "status": "open"}) for sku in low))


DOMAIN = Domain(
    name="warehouse", env_class=WarehouseEnv,
    introduction="The inventory system of a hardware warehouse.",
    rules=("Stock never goes below zero.", "Delivered purchase orders add their units to stock."),
    kinds=(restock, relocate_and_write_off, reorder_low_stock),
)
