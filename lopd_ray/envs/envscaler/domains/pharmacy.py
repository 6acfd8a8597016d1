"""A pharmacy: patients with allergies, drug stock, prescriptions with refills."""
from __future__ import annotations

from typing import Annotated

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, eq, find_by_field, match, ref,
                                                 set_fields)

DRUGS = ("amoxicillin", "ibuprofen", "lisinopril", "metformin", "atorvastatin", "omeprazole", "cetirizine",
         "sertraline", "albuterol", "levothyroxine", "penicillin", "naproxen")


class PharmacyEnv(DomainEnv):
    find_patient = find_by_field("patients", "patient_id", "Look a patient up by full name.",
                                 "no patient named '{name}'", name="the patient's full name.")

    find_drug = find_by_field("drugs", "drug_id", "Look a drug up by name.", "no drug named '{name}'",
                              name="the drug name.")

    @tool
    def create_prescription(self, patient_id: Annotated[str, "the patient."], drug_id: Annotated[str, "the drug."],
                            refills: Annotated[int, "refills allowed after the first fill."]) -> dict:
        """Write a prescription; it can be filled refills + 1 times."""
        patient, drug = self._get("patients", patient_id, "patient"), self._get("drugs", drug_id, "drug")
        if drug["name"] in patient["allergies"]:
            raise ToolError(f"the patient is allergic to {drug['name']}")
        if refills < 0:
            raise ToolError("refills cannot be negative")
        prescription = {"patient_id": patient_id, "drug_id": drug_id, "fills_left": refills + 1, "fills": 0,
                        "status": "active"}
        return {"prescription_id": self._insert("prescriptions", "RX", prescription)}

    @tool
    def list_prescriptions(self, patient_id: Annotated[str, "the patient."]) -> list:
        """A patient's active prescriptions."""
        self._get("patients", patient_id, "patient")
        return [{**p, "drug": self.drugs[p["drug_id"]]["name"]}
                for p in self._select("prescriptions", "prescription_id", patient_id=patient_id, status="active")]

    @tool
    def fill_prescription(self, prescription_id: Annotated[str, "the prescription."]) -> dict:
        """Dispense one fill of an active prescription from stock."""
        rx = self._get("prescriptions", prescription_id, "prescription")
        drug = self.drugs[rx["drug_id"]]
        if rx["status"] != "active" or rx["fills_left"] < 1:
            raise ToolError("the prescription has no fills left")
        if drug["stock"] < 1:
            raise ToolError("out of stock")
        rx["fills_left"] -= 1
        rx["fills"] += 1
        drug["stock"] -= 1
        return {"prescription_id": prescription_id, "fills_left": rx["fills_left"]}

    cancel_prescription = set_fields("prescriptions", "prescription", "Cancel a prescription.", "the prescription.",
                                     status="cancelled")


def _pharmacy(pick: Pick) -> dict:
    drugs = {did: {"name": n, "stock": pick.randint(5, 60)} for did, n in zip(pick.ids("DR", len(DRUGS)), DRUGS)}
    patients = {pid: {"name": n, "allergies": pick.sample(DRUGS, pick.randint(0, 2))}
                for pid, n in zip(pick.ids("PT", 6), pick.people(6))}
    return {"patients": patients, "drugs": drugs, "prescriptions": {}, "next_id": pick.counter()}


def _drug_id(init: dict, name: str) -> str:
    return next(did for did, d in init["drugs"].items() if d["name"] == name)


def prescribe(pick: Pick) -> Draft:
    init = _pharmacy(pick)
    pid, patient = pick.choice(list(init["patients"].items()))
    drug = pick.choice([d for d in DRUGS if d not in patient["allergies"]])
    did, refills = _drug_id(init, drug), pick.randint(0, 3)
    d = Draft(f"Prescribe {drug} to {patient['name']} with {refills} refill(s), and dispense the first fill now.",
              init)
    c0 = d.call("find_patient", name=patient["name"])
    c1 = d.call("find_drug", name=drug)
    c2 = d.call("create_prescription", patient_id=ref(c0, "patient_id"), drug_id=ref(c1, "drug_id"), refills=refills)
    d.call("fill_prescription", prescription_id=ref(c2, "prescription_id"))
    return d.check(match("prescriptions", {"patient_id": pid, "drug_id": did, "status": "active"}),
                   match("prescriptions", {"patient_id": pid, "drug_id": did, "fills": 1, "fills_left": refills}),
                   eq(("drugs", did, "stock"), init["drugs"][did]["stock"] - 1))


def _on_file(pick: Pick) -> tuple[dict, dict, list[str], int]:
    """A patient with two active prescriptions; returns (init, patient, rx ids, chosen index)."""
    init = _pharmacy(pick)
    pid, patient = pick.choice(list(init["patients"].items()))
    names = pick.sample([d for d in DRUGS if d not in patient["allergies"]], 2)
    rx_ids = pick.ids("RX", 2, digits=3)
    for rx, name in zip(rx_ids, names):
        init["prescriptions"][rx] = {"patient_id": pid, "drug_id": _drug_id(init, name),
                                     "fills_left": pick.randint(1, 3), "fills": 1, "status": "active"}
    return init, patient, rx_ids, pick.randrange(2)


def refill(pick: Pick) -> Draft:
    init, patient, rx_ids, index = _on_file(pick)
    rx = init["prescriptions"][rx_ids[index]]
    drug = init["drugs"][rx["drug_id"]]
    d = Draft(f"{patient['name']} is here to refill their {drug['name']} prescription. Dispense it.", init)
    c0 = d.call("find_patient", name=patient["name"])
    c1 = d.call("list_prescriptions", patient_id=ref(c0, "patient_id"))
    d.call("fill_prescription", prescription_id=ref(c1, index, "prescription_id"))
    return d.check(eq(("prescriptions", rx_ids[index], "fills"), 2),
                   eq(("drugs", rx["drug_id"], "stock"), drug["stock"] - 1))


def cancel(pick: Pick) -> Draft:
    init, patient, rx_ids, index = _on_file(pick)
    drug = init["drugs"][init["prescriptions"][rx_ids[index]]["drug_id"]]["name"]
    d = Draft(f"The doctor stopped {patient['name']}'s {drug}. Cancel that prescription.", init)
    c0 = d.call("find_patient", name=patient["name"])
    c1 = d.call("list_prescriptions", patient_id=ref(c0, "patient_id"))
    d.call("cancel_prescription", prescription_id=ref(c1, index, "prescription_id"))
    return d.check(eq(("prescriptions", rx_ids[index], "status"), "cancelled"))


DOMAIN = Domain(
    name="pharmacy", env_class=PharmacyEnv,
    introduction="The dispensing system of a community pharmacy.",
    rules=("Never prescribe a drug a patient is allergic to.", "Each fill takes one unit from stock."),
    kinds=(prescribe, refill, cancel),
)
