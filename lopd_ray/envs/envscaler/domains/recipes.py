"""A meal planner: recipes with ingredients, a pantry, a weekly meal plan and a shopping list."""
from __future__ import annotations

from typing import Annotated, Literal

from lopd_ray.envs.envscaler.core import tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, at_least_one, eq, match, ref

Day = Literal["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
INGREDIENTS = ("rice", "pasta", "tomatoes", "onions", "garlic", "chickpeas", "spinach", "eggs", "milk", "flour",
               "lentils", "carrots", "potatoes", "cheese", "basil", "lemons")
DISHES = ("Lentil stew", "Tomato pasta", "Spinach omelette", "Chickpea curry", "Potato gratin", "Lemon risotto",
          "Carrot soup", "Basil pesto bowl", "Garlic flatbread", "Veggie fried rice")


class RecipesEnv(DomainEnv):
    @tool
    def search_recipes(self, query: Annotated[str, "part of the recipe name."]) -> list:
        """Recipes whose name contains a text (case-insensitive)."""
        return [{"recipe_id": rid, "name": r["name"], "servings": r["servings"]}
                for rid, r in self.recipes.items() if query.lower() in r["name"].lower()]

    @tool
    def get_recipe(self, recipe_id: Annotated[str, "the recipe."]) -> dict:
        """A recipe with its ingredient quantities (grams or units)."""
        return {"recipe_id": recipe_id, **self._get("recipes", recipe_id, "recipe")}

    @tool
    def create_recipe(self, name: Annotated[str, "the recipe name."],
                      servings: Annotated[int, "how many people it feeds."]) -> dict:
        """Create a recipe without ingredients."""
        at_least_one(servings, "servings")
        return {"recipe_id": self._insert("recipes", "R", {"name": name, "servings": servings, "ingredients": {}})}

    @tool
    def add_ingredient(self, recipe_id: Annotated[str, "the recipe."],
                       ingredient: Annotated[str, "the ingredient name."],
                       quantity: Annotated[int, "grams or units."]) -> dict:
        """Add an ingredient to a recipe."""
        recipe = self._get("recipes", recipe_id, "recipe")
        at_least_one(quantity, "quantity")
        recipe["ingredients"][ingredient] = quantity
        return {"recipe_id": recipe_id, "ingredients": recipe["ingredients"]}

    @tool
    def plan_meal(self, day: Annotated[Day, "the weekday."], recipe_id: Annotated[str, "the recipe."]) -> dict:
        """Put a recipe on the meal plan for a day (replacing what was there)."""
        recipe = self._get("recipes", recipe_id, "recipe")
        self.meal_plan[day] = {"recipe_id": recipe_id, "recipe_name": recipe["name"]}
        return {"day": day, "recipe": recipe["name"]}

    @tool
    def check_pantry(self, ingredient: Annotated[str, "the ingredient name."]) -> dict:
        """How much of an ingredient is at home."""
        return {"ingredient": ingredient, "quantity": self.pantry.get(ingredient, 0)}

    @tool
    def add_to_shopping_list(self, item: Annotated[str, "the ingredient name."],
                             quantity: Annotated[int, "grams or units to buy."]) -> dict:
        """Add an amount of an item to the shopping list."""
        at_least_one(quantity, "quantity")
        self.shopping_list[item] = self.shopping_list.get(item, 0) + quantity
        return {"shopping_list": self.shopping_list}


def _kitchen(pick: Pick) -> dict:
    recipes = {}
    for rid, name in zip(pick.ids("R", 6, digits=3), pick.sample(DISHES, 6)):
        recipes[rid] = {"name": name, "servings": pick.randint(2, 6),
                        "ingredients": {i: pick.randint(1, 8) * 50 for i in pick.sample(INGREDIENTS, 3)}}
    pantry = {i: pick.randint(0, 6) * 50 for i in pick.sample(INGREDIENTS, 10)}
    plan = {day: None for day in DAYS}
    return {"recipes": recipes, "pantry": pantry, "meal_plan": plan, "shopping_list": {}, "next_id": pick.counter()}


def plan(pick: Pick) -> Draft:
    init = _kitchen(pick)
    rid, day = pick.choice(list(init["recipes"])), pick.choice(DAYS)
    name = init["recipes"][rid]["name"]
    d = Draft(f"Put {name} on the meal plan for {day}.", init)
    c0 = d.call("search_recipes", query=name)
    d.call("plan_meal", day=day, recipe_id=ref(c0, 0, "recipe_id"))
    return d.check(eq(("meal_plan", day, "recipe_id"), rid))


def new_recipe(pick: Pick) -> Draft:
    init = _kitchen(pick)
    name = f"{pick.choice(('Grandma', 'Quick', 'Sunday', 'Midnight'))} {pick.choice(('bake', 'salad', 'soup'))}"
    (i1, q1), (i2, q2) = [(i, pick.randint(1, 6) * 50) for i in pick.sample(INGREDIENTS, 2)]
    servings, day = pick.randint(2, 8), pick.choice(DAYS)
    d = Draft(f"Create a recipe called '{name}' for {servings} servings with {q1} g of {i1} and {q2} g of {i2}, "
              f"and put it on the meal plan for {day}.", init)
    c0 = d.call("create_recipe", name=name, servings=servings)
    d.call("add_ingredient", recipe_id=ref(c0, "recipe_id"), ingredient=i1, quantity=q1)
    d.call("add_ingredient", recipe_id=ref(c0, "recipe_id"), ingredient=i2, quantity=q2)
    d.call("plan_meal", day=day, recipe_id=ref(c0, "recipe_id"))
    return d.check(match("recipes", {"name": name, "servings": servings, "ingredients": {i1: q1, i2: q2}}),
                   eq(("meal_plan", day, "recipe_name"), name))


def shop_for(pick: Pick) -> Draft:
    init = _kitchen(pick)
    rid = pick.choice(list(init["recipes"]))
    recipe = init["recipes"][rid]
    first = next(iter(recipe["ingredients"]))
    init["pantry"][first] = 0  # at least one ingredient is missing
    missing = {i: q - init["pantry"].get(i, 0) for i, q in recipe["ingredients"].items()
               if q > init["pantry"].get(i, 0)}
    d = Draft(f"Add to the shopping list exactly what the pantry lacks to cook {recipe['name']} once.", init)
    c0 = d.call("search_recipes", query=recipe["name"])
    d.call("get_recipe", recipe_id=ref(c0, 0, "recipe_id"))
    for ingredient in recipe["ingredients"]:
        d.call("check_pantry", ingredient=ingredient)
    for ingredient, quantity in missing.items():
        d.call("add_to_shopping_list", item=ingredient, quantity=quantity)
    return d.check(*(eq(("shopping_list", i), q) for i, q in missing.items()))


DOMAIN = Domain(
    name="recipes", env_class=RecipesEnv,
    introduction="A household meal planner with a recipe book, a pantry inventory and a shopping list.",
    rules=("Quantities are whole grams or units.", "A day holds one planned meal."),
    kinds=(plan, new_recipe, shop_for),
)
