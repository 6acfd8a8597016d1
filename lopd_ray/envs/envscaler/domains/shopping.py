"""An online shop: product search, a cart, coupons, checkout and order cancellation."""
from __future__ import annotations

from typing import Annotated

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, eq, match, ref

PRODUCTS = ("wireless mouse", "usb-c cable", "laptop stand", "desk lamp", "notebook set", "water bottle",
            "phone case", "bluetooth speaker", "yoga mat", "coffee grinder", "backpack", "headphones",
            "power bank", "webcam")


class ShoppingEnv(DomainEnv):
    def _subtotal(self) -> int:
        return sum(self.products[pid]["price"] * qty for pid, qty in self.cart.items())

    @tool
    def search_products(self, query: Annotated[str, "part of the product name."]) -> list:
        """Products whose name contains a text (case-insensitive)."""
        return [{"product_id": pid, **p} for pid, p in self.products.items() if query.lower() in p["name"].lower()]

    @tool
    def add_to_cart(self, product_id: Annotated[str, "the product."],
                    quantity: Annotated[int, "how many units."]) -> dict:
        """Put units of a product in the cart."""
        product = self._get("products", product_id, "product")
        if quantity < 1 or self.cart.get(product_id, 0) + quantity > product["stock"]:
            raise ToolError(f"quantity must be at least 1 and at most the {product['stock']} in stock")
        self.cart[product_id] = self.cart.get(product_id, 0) + quantity
        return {"cart": self.cart}

    @tool
    def remove_from_cart(self, product_id: Annotated[str, "the product."]) -> dict:
        """Take a product out of the cart."""
        if product_id not in self.cart:
            raise ToolError("that product is not in the cart")
        del self.cart[product_id]
        return {"cart": self.cart}

    @tool
    def view_cart(self) -> dict:
        """The cart's lines, subtotal and applied coupon."""
        lines = [{"product_id": pid, "name": self.products[pid]["name"], "quantity": q} for pid, q in self.cart.items()]
        return {"items": lines, "subtotal": self._subtotal(), "coupon": self.coupon}

    @tool
    def apply_coupon(self, code: Annotated[str, "the coupon code."]) -> dict:
        """Apply a coupon code to the next checkout."""
        if code not in self.coupons or self.coupons[code]["used"]:
            raise ToolError("invalid or already used coupon")
        self.coupon = code
        return {"coupon": code, "percent_off": self.coupons[code]["percent_off"]}

    @tool
    def checkout(self) -> dict:
        """Place an order for the cart (coupon applied, total rounded down to whole dollars) and empty it."""
        if not self.cart:
            raise ToolError("the cart is empty")
        percent = self.coupons[self.coupon]["percent_off"] if self.coupon else 0
        total = self._subtotal() * (100 - percent) // 100
        for pid, qty in self.cart.items():
            self.products[pid]["stock"] -= qty
        if self.coupon:
            self.coupons[self.coupon]["used"] = True
        order_id = self._insert("orders", "ORD", {"items": dict(self.cart), "total": total, "status": "placed"})
        self.cart, self.coupon = {}, None
        return {"order_id": order_id, "total": total}

    @tool
    def list_orders(self) -> list:
        """All orders, oldest first."""
        return self._select("orders", "order_id")

    @tool
    def cancel_order(self, order_id: Annotated[str, "the order."]) -> dict:
        """Cancel a placed order; its units go back in stock."""
        order = self._get_in_state("orders", order_id, "order", "the order is already cancelled", status="placed")
        order["status"] = "cancelled"
        for pid, qty in order["items"].items():
            self.products[pid]["stock"] += qty
        return {"order_id": order_id, "status": "cancelled"}


def _shop(pick: Pick) -> dict:
    products = {pid: {"name": n, "price": pick.randint(5, 120), "stock": pick.randint(5, 40)}
                for pid, n in zip(pick.ids("P", len(PRODUCTS)), PRODUCTS)}
    coupons = {f"{w.upper()}{p}": {"percent_off": p, "used": False}
               for w, p in zip(pick.words(3), pick.sample((5, 10, 15, 20, 25), 3))}
    return {"products": products, "cart": {}, "coupon": None, "coupons": coupons, "orders": {},
            "next_id": pick.counter()}


def buy_with_coupon(pick: Pick) -> Draft:
    init = _shop(pick)
    (p1, a), (p2, b) = pick.sample(list(init["products"].items()), 2)
    q1, q2 = pick.randint(1, 3), pick.randint(1, 3)
    code = pick.choice(list(init["coupons"]))
    total = (a["price"] * q1 + b["price"] * q2) * (100 - init["coupons"][code]["percent_off"]) // 100
    d = Draft(f"Buy {q1} x {a['name']} and {q2} x {b['name']} in one order, using the coupon {code}.", init)
    c0 = d.call("search_products", query=a["name"])
    d.call("add_to_cart", product_id=ref(c0, 0, "product_id"), quantity=q1)
    c2 = d.call("search_products", query=b["name"])
    d.call("add_to_cart", product_id=ref(c2, 0, "product_id"), quantity=q2)
    d.call("apply_coupon", code=code)
    d.call("checkout")
    return d.check(match("orders", {"items": {p1: q1, p2: q2}, "total": total, "status": "placed"}),
                   eq(("coupons", code, "used"), True))


def swap_order(pick: Pick) -> Draft:
    init = _shop(pick)
    (p1, a), (p2, b) = pick.sample(list(init["products"].items()), 2)
    older, latest = pick.ids("ORD", 2, digits=3)
    pid, p = pick.choice([(k, v) for k, v in init["products"].items() if k not in (p1, p2)])
    init["orders"][older] = {"items": {pid: 1}, "total": p["price"], "status": "placed"}
    init["orders"][latest] = {"items": {p1: 2}, "total": 2 * a["price"], "status": "placed"}
    q = pick.randint(1, 3)
    d = Draft(f"Cancel my most recent order (the {a['name']}s) and order {q} x {b['name']} instead.", init)
    c0 = d.call("list_orders")
    d.call("cancel_order", order_id=ref(c0, 1, "order_id"))
    c2 = d.call("search_products", query=b["name"])
    d.call("add_to_cart", product_id=ref(c2, 0, "product_id"), quantity=q)
    d.call("checkout")
    return d.check(eq(("orders", latest, "status"), "cancelled"),
                   match("orders", {"items": {p2: q}, "status": "placed"}))


def fix_cart(pick: Pick) -> Draft:
    init = _shop(pick)
    (p1, a), (p2, b) = pick.sample(list(init["products"].items()), 2)
    init["cart"] = {p1: 1}
    q = pick.randint(1, 3)
    d = Draft(f"My cart has a {a['name']} I no longer want. Remove it, add {q} x {b['name']} and check out.", init)
    c0 = d.call("view_cart")
    d.call("remove_from_cart", product_id=ref(c0, "items", 0, "product_id"))
    c2 = d.call("search_products", query=b["name"])
    d.call("add_to_cart", product_id=ref(c2, 0, "product_id"), quantity=q)
    d.call("checkout")
    return d.check(match("orders", {"items": {p2: q}, "total": q * b["price"], "status": "placed"}))


DOMAIN = Domain(
    name="shopping", env_class=ShoppingEnv,
    introduction="The customer account of an online electronics and home goods shop.",
    rules=("A coupon can be used once.", "Order totals are rounded down to whole dollars.",
           "Cancelling an order puts its units back in stock."),
    kinds=(buy_with_coupon, swap_order, fix_cart),
)
