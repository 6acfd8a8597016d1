"""A smart home hub: lights, thermostats and door locks by room, and scenes."""
from __future__ import annotations

from typing import Annotated, Optional

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, eq, has, match, ref

ROOMS = ("kitchen", "living room", "bedroom", "office", "hallway", "garage", "nursery", "den")
LEVEL_RANGE = {"light": (0, 100), "thermostat": (10, 30)}


class SmartHomeEnv(DomainEnv):
    def _device(self, device_id: str, *kinds: str) -> dict:
        device = self._get("devices", device_id, "device")
        if device["kind"] not in kinds:
            raise ToolError(f"a {device['kind']} does not support this")
        return device

    @tool
    def list_devices(self, room: Annotated[str, "the room name, e.g. kitchen."]) -> list:
        """The devices of a room with their current settings."""
        found = self._select("devices", "device_id", room=room)
        if not found:
            raise ToolError(f"no devices in '{room}'")
        return found

    @tool
    def set_power(self, device_id: Annotated[str, "the device."],
                  on: Annotated[bool, "true for on, false for off."]) -> dict:
        """Switch a light or thermostat on or off."""
        self._device(device_id, "light", "thermostat")["on"] = on
        return {"device_id": device_id, "on": on}

    @tool
    def set_level(self, device_id: Annotated[str, "the device."],
                  level: Annotated[int, "the brightness or temperature."]) -> dict:
        """Set a light's brightness (0-100) or a thermostat's target temperature (10-30 degrees)."""
        device = self._device(device_id, "light", "thermostat")
        low, high = LEVEL_RANGE[device["kind"]]
        if not low <= level <= high:
            raise ToolError(f"a {device['kind']} level must be within {low}-{high}")
        device["level"] = level
        return {"device_id": device_id, "level": level}

    @tool
    def set_lock(self, device_id: Annotated[str, "the lock."], locked: Annotated[bool, "true to lock."]) -> dict:
        """Lock or unlock a door lock."""
        self._device(device_id, "lock")["locked"] = locked
        return {"device_id": device_id, "locked": locked}

    @tool
    def create_scene(self, name: Annotated[str, "the scene name."]) -> dict:
        """Create an empty scene."""
        return {"scene_id": self._insert("scenes", "SC", {"name": name, "actions": []})}

    @tool
    def add_to_scene(self, scene_id: Annotated[str, "the scene."], device_id: Annotated[str, "the device."],
                     on: Annotated[bool, "whether the scene switches it on."],
                     level: Annotated[Optional[int], "brightness or temperature the scene sets."] = None) -> dict:
        """Make a scene set a light or thermostat."""
        scene = self._get("scenes", scene_id, "scene")
        self._device(device_id, "light", "thermostat")
        scene["actions"].append({"device_id": device_id, "on": on, "level": level})
        return {"scene_id": scene_id, "actions": scene["actions"]}


def _home(pick: Pick, room: str) -> dict:
    devices = {}
    ids = iter(pick.ids("D", 30, digits=3))
    for r in pick.sample([x for x in ROOMS if x != room], 3) + [room]:
        for n in range(pick.randint(2, 3)):
            devices[next(ids)] = {"name": f"{r} light {n + 1}", "room": r, "kind": "light", "on": pick.random() < 0.5,
                                  "level": pick.randint(10, 100)}
        devices[next(ids)] = {"name": f"{r} thermostat", "room": r, "kind": "thermostat", "on": True,
                              "level": pick.randint(17, 23)}
        devices[next(ids)] = {"name": f"{r} door", "room": r, "kind": "lock", "locked": False}
    return {"devices": devices, "scenes": {}, "next_id": pick.counter()}


def _in_room(init: dict, room: str) -> list[tuple[str, dict]]:
    return [(did, d) for did, d in init["devices"].items() if d["room"] == room]


def lights_off(pick: Pick) -> Draft:
    room = pick.choice(ROOMS)
    init = _home(pick, room)
    listed = _in_room(init, room)
    listed[0][1]["on"] = True
    d = Draft(f"Turn off every light in the {room}.", init)
    c0 = d.call("list_devices", room=room)
    lit = [i for i, (_, dev) in enumerate(listed) if dev["kind"] == "light" and dev["on"]]
    for i in lit:
        d.call("set_power", device_id=ref(c0, i, "device_id"), on=False)
    return d.check(*(eq(("devices", listed[i][0], "on"), False) for i in lit))


def thermostat_and_lock(pick: Pick) -> Draft:
    room = pick.choice(ROOMS)
    init = _home(pick, room)
    listed = _in_room(init, room)
    kinds = [dev["kind"] for _, dev in listed]
    t, lock = kinds.index("thermostat"), kinds.index("lock")
    temp = pick.choice([x for x in range(16, 27) if x != listed[t][1]["level"]])
    d = Draft(f"Set the {room} thermostat to {temp} degrees and lock the {room} door.", init)
    c0 = d.call("list_devices", room=room)
    d.call("set_level", device_id=ref(c0, t, "device_id"), level=temp)
    d.call("set_lock", device_id=ref(c0, lock, "device_id"), locked=True)
    return d.check(eq(("devices", listed[t][0], "level"), temp), eq(("devices", listed[lock][0], "locked"), True))


def make_scene(pick: Pick) -> Draft:
    room = pick.choice(ROOMS)
    init = _home(pick, room)
    listed = _in_room(init, room)
    index = pick.choice([i for i, (_, dev) in enumerate(listed) if dev["kind"] == "light"])
    did, light = listed[index]
    name, level = f"{pick.choice(('Evening', 'Movie', 'Focus', 'Wake up', 'Dinner'))} {room}", pick.randint(5, 95)
    d = Draft(f"Create a scene called '{name}' that switches on the {light['name']} at brightness {level}.", init)
    c0 = d.call("create_scene", name=name)
    c1 = d.call("list_devices", room=room)
    d.call("add_to_scene", scene_id=ref(c0, "scene_id"), device_id=ref(c1, index, "device_id"), on=True, level=level)
    return d.check(match("scenes", {"name": name, "actions": has({"device_id": did, "on": True, "level": level})}))


DOMAIN = Domain(
    name="smarthome", env_class=SmartHomeEnv,
    introduction="A smart home hub controlling lights, thermostats and door locks room by room.",
    rules=("Light brightness is 0-100.", "Thermostat targets are 10-30 degrees.", "Only locks can be locked."),
    kinds=(lights_off, thermostat_and_lock, make_scene),
)
