"""A restaurant's order system: a menu, table orders that are opened, filled, submitted and paid."""
from __future__ import annotations

from typing import Annotated

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, at_least_one, eq, find_by_field, has,
                                                 match, no_match, ref)

DISHES = ("tomato soup", "caesar salad", "margherita pizza", "beef burger", "mushroom risotto", "fish tacos",
          "pad thai", "lamb curry", "veggie wrap", "chocolate cake", "lemon tart", "iced tea", "lemonade", "espresso")


class RestaurantEnv(DomainEnv):
    def _order(self, order_id: str, *allowed: str) -> dict:
        order = self._get("orders", order_id, "order")
        if order["status"] not in allowed:
            raise ToolError(f"the order is {order['status']}")
        return order

    find_menu_item = find_by_field("menu", "item_id", "Look a dish up on the menu by name.",
                                   "'{name}' is not on the menu", name="the dish name.")

    @tool
    def open_order(self, table_number: Annotated[int, "the table."]) -> dict:
        """Start a new order for a table."""
        if any(o["table"] == table_number and o["status"] != "paid" for o in self.orders.values()):
            raise ToolError("that table already has an unpaid order")
        return {"order_id": self._insert("orders", "OR", {"table": table_number, "items": [], "status": "open"})}

    @tool
    def find_open_order(self, table_number: Annotated[int, "the table."]) -> dict:
        """The unpaid order of a table."""
        for order_id, order in self.orders.items():
            if order["table"] == table_number and order["status"] != "paid":
                return {"order_id": order_id, **order}
        raise ToolError(f"table {table_number} has no unpaid order")

    @tool
    def add_item(self, order_id: Annotated[str, "the order."], item_id: Annotated[str, "the dish."],
                 quantity: Annotated[int, "how many."]) -> dict:
        """Add dishes to an order that has not been paid."""
        order = self._order(order_id, "open", "submitted")
        if not self._get("menu", item_id, "menu item")["available"]:
            raise ToolError("that dish is sold out")
        at_least_one(quantity, "quantity")
        line = next((line for line in order["items"] if line["item_id"] == item_id), None)
        if line:
            line["quantity"] += quantity
        else:
            order["items"].append({"item_id": item_id, "quantity": quantity})
        return {"order_id": order_id, "items": order["items"]}

    @tool
    def remove_item(self, order_id: Annotated[str, "the order."], item_id: Annotated[str, "the dish."]) -> dict:
        """Remove a dish (all of its portions) from an order that has not been paid."""
        order = self._order(order_id, "open", "submitted")
        if not any(line["item_id"] == item_id for line in order["items"]):
            raise ToolError("that dish is not on the order")
        order["items"] = [line for line in order["items"] if line["item_id"] != item_id]
        return {"order_id": order_id, "items": order["items"]}

    @tool
    def submit_order(self, order_id: Annotated[str, "the order."]) -> dict:
        """Send an open order to the kitchen."""
        order = self._order(order_id, "open")
        if not order["items"]:
            raise ToolError("the order is empty")
        order["status"] = "submitted"
        return {"order_id": order_id, "status": "submitted"}

    @tool
    def pay_order(self, order_id: Annotated[str, "the order."]) -> dict:
        """Take payment for a submitted order."""
        order = self._order(order_id, "submitted")
        order["status"] = "paid"
        total = sum(self.menu[line["item_id"]]["price"] * line["quantity"] for line in order["items"])
        return {"order_id": order_id, "status": "paid", "total": total}


def _restaurant(pick: Pick) -> dict:
    menu = {iid: {"name": n, "price": pick.randint(3, 30), "available": True}
            for iid, n in zip(pick.ids("MI", len(DISHES), digits=3), DISHES)}
    return {"menu": menu, "orders": {}, "next_id": pick.counter()}


def take_order(pick: Pick) -> Draft:
    init = _restaurant(pick)
    table = pick.randint(1, 30)
    (id1, d1), (id2, d2) = pick.sample(list(init["menu"].items()), 2)
    q1, q2 = pick.randint(1, 4), pick.randint(1, 4)
    d = Draft(f"Table {table} orders {q1} x {d1['name']} and {q2} x {d2['name']}. Open an order for them, add the "
              f"dishes and submit it to the kitchen.", init)
    c0 = d.call("open_order", table_number=table)
    c1 = d.call("find_menu_item", name=d1["name"])
    d.call("add_item", order_id=ref(c0, "order_id"), item_id=ref(c1, "item_id"), quantity=q1)
    c3 = d.call("find_menu_item", name=d2["name"])
    d.call("add_item", order_id=ref(c0, "order_id"), item_id=ref(c3, "item_id"), quantity=q2)
    d.call("submit_order", order_id=ref(c0, "order_id"))
    return d.check(match("orders", {"table": table, "status": "submitted", "items": has({"item_id": id1,
                                                                                          "quantity": q1})}),
                   match("orders", {"table": table, "status": "submitted", "items": has({"item_id": id2,
                                                                                          "quantity": q2})}))


def send_back_and_pay(pick: Pick) -> Draft:
    init = _restaurant(pick)
    table = pick.randint(1, 30)
    lines = [{"item_id": iid, "quantity": pick.randint(1, 3)} for iid in pick.sample(list(init["menu"]), 3)]
    order_id = pick.ids("OR", 1, digits=3)[0]
    init["orders"][order_id] = {"table": table, "items": lines, "status": "submitted"}
    gone = pick.choice(lines)["item_id"]
    name = init["menu"][gone]["name"]
    d = Draft(f"Table {table} sent the {name} back. Remove it from their order, then take their payment.", init)
    c0 = d.call("find_open_order", table_number=table)
    c1 = d.call("find_menu_item", name=name)
    d.call("remove_item", order_id=ref(c0, "order_id"), item_id=ref(c1, "item_id"))
    d.call("pay_order", order_id=ref(c0, "order_id"))
    return d.check(no_match(("orders", order_id, "items"), {"item_id": gone}),
                   eq(("orders", order_id, "status"), "paid"))


DOMAIN = Domain(
    name="restaurant", env_class=RestaurantEnv,
    introduction="The point-of-sale system of a restaurant.",
    rules=("A table has at most one unpaid order.", "Only submitted orders can be paid.",
           "Paid orders cannot change."),
    kinds=(take_order, send_back_and_pay),
)
