"""A to-do app: named lists of tasks with priorities, due dates and a done flag."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, absent, delete_record, eq, match,
                                                 parse_date, ref, set_fields)

Priority = Literal["low", "medium", "high"]
LISTS = ("Groceries", "Home repairs", "Work", "Garden", "Trip prep", "Birthday party", "Reading", "Errands")
TASKS = ("buy milk", "fix the sink", "email the landlord", "water the ferns", "book train tickets", "pay rent",
         "renew passport", "call the plumber", "order a cake", "return library books", "clean the gutters",
         "write the report", "pack the tent", "charge the camera", "send invitations", "mow the lawn")


class TodoEnv(DomainEnv):
    @tool
    def find_list(self, name: Annotated[str, "the list name."]) -> dict:
        """Look a list up by name."""
        list_id, _ = self._find("lists", f"no list named '{name}'", name=name)
        return {"list_id": list_id, "name": name}

    @tool
    def create_list(self, name: Annotated[str, "the list name (unique)."]) -> dict:
        """Create an empty list."""
        if any(lst["name"] == name for lst in self.lists.values()):
            raise ToolError(f"a list named '{name}' exists already")
        return {"list_id": self._insert("lists", "L", {"name": name})}

    @tool
    def add_task(self, list_id: Annotated[str, "the list."], title: Annotated[str, "what to do."],
                 priority: Annotated[Priority, "low, medium or high."]) -> dict:
        """Add a task to a list."""
        self._get("lists", list_id, "list")
        task = {"list_id": list_id, "title": title, "priority": priority, "done": False, "due": None}
        return {"task_id": self._insert("tasks", "T", task)}

    @tool
    def find_tasks(self, list_id: Annotated[str, "the list."],
                   title_contains: Annotated[Optional[str], "part of the title (case-insensitive)."] = None) -> list:
        """The tasks of a list, optionally only those whose title contains a text."""
        self._get("lists", list_id, "list")
        return [{"task_id": tid, **t} for tid, t in self.tasks.items() if t["list_id"] == list_id
                and (title_contains is None or title_contains.lower() in t["title"].lower())]

    complete_task = set_fields("tasks", "task", "Mark a task as done.", "the task.", done=True)

    @tool
    def set_due_date(self, task_id: Annotated[str, "the task."],
                     due_date: Annotated[str, "the day, YYYY-MM-DD."]) -> dict:
        """Set the due date of a task."""
        task = self._get("tasks", task_id, "task")
        parse_date(due_date)
        task["due"] = due_date
        return {"task_id": task_id, "due": due_date}

    delete_task = delete_record("tasks", "task", "Delete a task.", "the task.", "deleted")


def _todo(pick: Pick, names: list[str]) -> dict:
    lists = {lid: {"name": n} for lid, n in zip(pick.ids("L", len(names), digits=3), names)}
    titles, ids = iter(pick.sample(TASKS, 3 * len(names))), iter(pick.ids("T", 3 * len(names)))
    tasks = {}
    for lid in lists:
        for _ in range(3):
            tasks[next(ids)] = {"list_id": lid, "title": next(titles), "priority": pick.choice(
                ("low", "medium", "high")), "done": pick.random() < 0.3, "due": None}
    return {"lists": lists, "tasks": tasks, "next_id": pick.counter()}


def new_list(pick: Pick) -> Draft:
    names = pick.sample(LISTS, 3)
    init = _todo(pick, names[:2])
    used = {t["title"] for t in init["tasks"].values()}
    t1, t2 = pick.sample([t for t in TASKS if t not in used], 2)
    d = Draft(f"Create a to-do list called '{names[2]}' with the tasks '{t1}' (high priority) and '{t2}' "
              f"(low priority).", init)
    c0 = d.call("create_list", name=names[2])
    d.call("add_task", list_id=ref(c0, "list_id"), title=t1, priority="high")
    d.call("add_task", list_id=ref(c0, "list_id"), title=t2, priority="low")
    return d.check(match("lists", {"name": names[2]}), match("tasks", {"title": t1, "priority": "high"}),
                   match("tasks", {"title": t2, "priority": "low"}))


def complete_and_schedule(pick: Pick) -> Draft:
    names = pick.sample(LISTS, 2)
    init = _todo(pick, names)
    lid = next(iter(init["lists"]))
    mine = [tid for tid, t in init["tasks"].items() if t["list_id"] == lid]
    for tid in mine:
        init["tasks"][tid]["done"] = False
    done_id, due_id = pick.sample(mine, 2)
    due = pick.date(month=7)
    done_title, due_title = init["tasks"][done_id]["title"], init["tasks"][due_id]["title"]
    d = Draft(f"In the list '{names[0]}', mark '{done_title}' as done and make '{due_title}' due on {due}.", init)
    c0 = d.call("find_list", name=names[0])
    c1 = d.call("find_tasks", list_id=ref(c0, "list_id"), title_contains=done_title)
    d.call("complete_task", task_id=ref(c1, 0, "task_id"))
    c3 = d.call("find_tasks", list_id=ref(c0, "list_id"), title_contains=due_title)
    d.call("set_due_date", task_id=ref(c3, 0, "task_id"), due_date=due)
    return d.check(eq(("tasks", done_id, "done"), True), eq(("tasks", due_id, "due"), due))


def clear_done(pick: Pick) -> Draft:
    names = pick.sample(LISTS, 2)
    init = _todo(pick, names)
    lid = next(iter(init["lists"]))
    mine = [tid for tid, t in init["tasks"].items() if t["list_id"] == lid]
    for i, tid in enumerate(mine):
        init["tasks"][tid]["done"] = i == 0 or pick.random() < 0.5
    d = Draft(f"Delete every completed task from the list '{names[0]}'.", init)
    c0 = d.call("find_list", name=names[0])
    c1 = d.call("find_tasks", list_id=ref(c0, "list_id"))
    doomed = [i for i, tid in enumerate(mine) if init["tasks"][tid]["done"]]
    for i in doomed:
        d.call("delete_task", task_id=ref(c1, i, "task_id"))
    return d.check(*(absent(("tasks", mine[i])) for i in doomed))


DOMAIN = Domain(
    name="todo", env_class=TodoEnv,
    introduction="A personal to-do app with named lists.",
    rules=("List names are unique.", "Dates are YYYY-MM-DD."),
    kinds=(new_list, complete_and_schedule, clear_done),
)
