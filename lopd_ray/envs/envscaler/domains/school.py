"""A school registrar: students, courses with capacity, enrollments with letter grades."""
from __future__ import annotations

from typing import Annotated, Literal

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, eq, find_by_field, match, ref,
                                                 set_fields)

Grade = Literal["A", "B", "C", "D", "F"]
COURSES = ("Algebra II", "World History", "Biology", "Chemistry", "Creative Writing", "Physics", "Spanish I",
           "Music Theory", "Economics", "Computer Science", "Geometry", "Art Studio")


class SchoolEnv(DomainEnv):
    find_student = find_by_field("students", "student_id", "Look a student up by full name.",
                                 "no student named '{name}'", name="the student's full name.")

    find_course = find_by_field("courses", "course_id", "Look a course up by title.", "no course titled '{title}'",
                                title="the course title.")

    @tool
    def enroll_student(self, student_id: Annotated[str, "the student."],
                       course_id: Annotated[str, "the course."]) -> dict:
        """Enroll a student in a course that has room."""
        self._get("students", student_id, "student")
        course = self._get("courses", course_id, "course")
        taken = [e for e in self.enrollments.values() if e["course_id"] == course_id and e["status"] == "enrolled"]
        if any(e["student_id"] == student_id for e in taken):
            raise ToolError("the student is already enrolled")
        if len(taken) >= course["capacity"]:
            raise ToolError("the course is full")
        enrollment = {"student_id": student_id, "course_id": course_id, "grade": None, "status": "enrolled"}
        return {"enrollment_id": self._insert("enrollments", "EN", enrollment)}

    @tool
    def get_transcript(self, student_id: Annotated[str, "the student."]) -> list:
        """A student's current enrollments with grades."""
        self._get("students", student_id, "student")
        return [{"enrollment_id": eid, "course": self.courses[e["course_id"]]["title"], "grade": e["grade"]}
                for eid, e in self.enrollments.items() if e["student_id"] == student_id and e["status"] == "enrolled"]

    @tool
    def record_grade(self, enrollment_id: Annotated[str, "the enrollment."],
                     grade: Annotated[Grade, "A, B, C, D or F."]) -> dict:
        """Record or correct the final grade of an enrollment."""
        self._get_in_state("enrollments", enrollment_id, "enrollment", "the course was dropped", status="enrolled")
        return self._update("enrollments", enrollment_id, "enrollment", grade=grade)

    drop_course = set_fields("enrollments", "enrollment", "Withdraw a student from a course.", "the enrollment.",
                             status="dropped")


def _school(pick: Pick) -> dict:
    students = {sid: {"name": n, "year": pick.randint(9, 12)} for sid, n in zip(pick.ids("S", 8), pick.people(8))}
    courses = {cid: {"title": t, "capacity": pick.randint(15, 30)}
               for cid, t in zip(pick.ids("CR", 8, digits=3), pick.sample(COURSES, 8))}
    return {"students": students, "courses": courses, "enrollments": {}, "next_id": pick.counter()}


def enroll_and_grade(pick: Pick) -> Draft:
    init = _school(pick)
    sid, cid = pick.choice(list(init["students"])), pick.choice(list(init["courses"]))
    name, title, grade = init["students"][sid]["name"], init["courses"][cid]["title"], pick.choice("ABCDF")
    d = Draft(f"Enroll {name} in {title} and record a final grade of {grade} for it.", init)
    c0 = d.call("find_student", name=name)
    c1 = d.call("find_course", title=title)
    c2 = d.call("enroll_student", student_id=ref(c0, "student_id"), course_id=ref(c1, "course_id"))
    d.call("record_grade", enrollment_id=ref(c2, "enrollment_id"), grade=grade)
    return d.check(match("enrollments", {"student_id": sid, "course_id": cid, "status": "enrolled"}),
                   match("enrollments", {"student_id": sid, "course_id": cid, "grade": grade}))


def _enrolled(pick: Pick) -> tuple[dict, str, list[str], list[str], int]:
    init = _school(pick)
    sid = pick.choice(list(init["students"]))
    cids, eids = pick.sample(list(init["courses"]), 3), pick.ids("EN", 3, digits=3)
    for eid, cid in zip(eids, cids):
        init["enrollments"][eid] = {"student_id": sid, "course_id": cid, "grade": pick.choice("ABCD"),
                                    "status": "enrolled"}
    return init, sid, cids, eids, pick.randrange(3)


def regrade(pick: Pick) -> Draft:
    init, sid, cids, eids, index = _enrolled(pick)
    grade = pick.choice([g for g in "ABCDF" if g != init["enrollments"][eids[index]]["grade"]])
    name, title = init["students"][sid]["name"], init["courses"][cids[index]]["title"]
    d = Draft(f"{name}'s grade in {title} was miscalculated; change it to {grade}.", init)
    c0 = d.call("find_student", name=name)
    c1 = d.call("get_transcript", student_id=ref(c0, "student_id"))
    d.call("record_grade", enrollment_id=ref(c1, index, "enrollment_id"), grade=grade)
    return d.check(eq(("enrollments", eids[index], "grade"), grade))


def drop(pick: Pick) -> Draft:
    init, sid, cids, eids, index = _enrolled(pick)
    name, title = init["students"][sid]["name"], init["courses"][cids[index]]["title"]
    d = Draft(f"{name} is dropping {title}. Withdraw them from it.", init)
    c0 = d.call("find_student", name=name)
    c1 = d.call("get_transcript", student_id=ref(c0, "student_id"))
    d.call("drop_course", enrollment_id=ref(c1, index, "enrollment_id"))
    return d.check(eq(("enrollments", eids[index], "status"), "dropped"))


DOMAIN = Domain(
    name="school", env_class=SchoolEnv,
    introduction="A high school's registrar system.",
    rules=("Courses have a capacity.", "Grades are A, B, C, D or F.", "Dropped courses keep no grade changes."),
    kinds=(enroll_and_grade, regrade, drop),
)
