"""An email client: a mailbox with folders, labels and read flags, and an address book."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, append_once, contains, eq,
                                                 find_by_field, match, ref, set_fields)

Folder = Literal["inbox", "archive", "important", "spam"]
SUBJECTS = ("Invoice for May", "Team offsite", "Contract draft", "Lunch on Friday", "Server outage", "Budget 2026",
            "Interview feedback", "Travel plans", "Security update", "Press release", "Board minutes", "Q3 targets")
LABELS = ("finance", "urgent", "follow-up", "legal", "travel", "hr")


class EmailEnv(DomainEnv):
    find_contact = find_by_field("contacts", None, "Look an email address up by full name.",
                                 "no contact named '{name}'", name="the person's full name.")

    @tool
    def search_emails(self, sender: Annotated[Optional[str], "the sender's email address."] = None,
                      subject_contains: Annotated[Optional[str], "part of the subject (case-insensitive)."] = None,
                      folder: Annotated[Optional[Folder], "the folder."] = None) -> list:
        """Received emails matching every given filter, oldest first."""
        return [{"email_id": eid, "sender": m["sender"], "subject": m["subject"], "folder": m["folder"],
                 "read": m["read"]}
                for eid, m in self.messages.items() if m["folder"] != "sent"
                and sender in (None, m["sender"]) and (folder in (None, m["folder"]))
                and (subject_contains is None or subject_contains.lower() in m["subject"].lower())]

    @tool
    def read_email(self, email_id: Annotated[str, "the email."]) -> dict:
        """The full content of an email."""
        return {"email_id": email_id, **self._get("messages", email_id, "email")}

    @tool
    def send_email(self, to: Annotated[str, "the recipient's email address."],
                   subject: Annotated[str, "the subject line."], body: Annotated[str, "the message text."]) -> dict:
        """Send an email; a copy is kept in the sent folder."""
        if "@" not in to:
            raise ToolError(f"'{to}' is not an email address")
        sent = {"sender": self.address, "recipient": to, "subject": subject, "body": body, "folder": "sent",
                "read": True, "labels": []}
        return {"email_id": self._insert("messages", "EM", sent)}

    @tool
    def move_email(self, email_id: Annotated[str, "the email."],
                   folder: Annotated[Folder, "the destination folder."]) -> dict:
        """Move a received email to a folder."""
        if self._get("messages", email_id, "email")["folder"] == "sent":
            raise ToolError("sent emails stay in the sent folder")
        return self._update("messages", email_id, "email", folder=folder)

    mark_read = set_fields("messages", "email", "Mark an email as read.", "the email.", read=True)

    @tool
    def add_label(self, email_id: Annotated[str, "the email."], label: Annotated[str, "the label text."]) -> dict:
        """Attach a label to an email."""
        labels = self._get("messages", email_id, "email")["labels"]
        return {"email_id": email_id, "labels": append_once(labels, label)}


def _mailbox(pick: Pick) -> dict:
    people = pick.people(5)
    contacts = {cid: {"name": n, "email": f"{n.split()[0].lower()}@{n.split()[1].lower()}.example"}
                for cid, n in zip(pick.ids("C", 5), people)}
    senders = [c["email"] for c in contacts.values()]
    messages = {eid: {"sender": pick.choice(senders), "recipient": "me@mail.example", "subject": subject,
                      "body": " ".join(pick.words(8)), "folder": "inbox", "read": False, "labels": []}
                for eid, subject in zip(pick.ids("EM", 8, digits=3), pick.sample(SUBJECTS, 8))}
    return {"address": "me@mail.example", "contacts": contacts, "messages": messages, "next_id": pick.counter()}


def reply(pick: Pick) -> Draft:
    init = _mailbox(pick)
    eid, message = pick.choice(list(init["messages"].items()))
    name = next(c["name"] for c in init["contacts"].values() if c["email"] == message["sender"])
    subject, body = f"Re: {message['subject']}", f"Thanks, {name.split()[0]}. {' '.join(pick.words(4))}."
    d = Draft(f"Reply to {name}'s email '{message['subject']}': send them a message with the subject '{subject}' "
              f"and the body '{body}'. Then mark their email as read.", init)
    c0 = d.call("find_contact", name=name)
    d.call("send_email", to=ref(c0, "email"), subject=subject, body=body)
    c2 = d.call("search_emails", sender=ref(c0, "email"), subject_contains=message["subject"])
    d.call("mark_read", email_id=ref(c2, 0, "email_id"))
    return d.check(match("messages", {"recipient": message["sender"], "subject": subject, "body": body,
                                      "folder": "sent"}),
                   eq(("messages", eid, "read"), True))


def archive_sender(pick: Pick) -> Draft:
    init = _mailbox(pick)
    sender = pick.choice(sorted({m["sender"] for m in init["messages"].values()}))
    name = next(c["name"] for c in init["contacts"].values() if c["email"] == sender)
    theirs = [e for e, m in init["messages"].items() if m["sender"] == sender]
    d = Draft(f"Move every email from {name} to the archive folder.", init)
    c0 = d.call("find_contact", name=name)
    c1 = d.call("search_emails", sender=ref(c0, "email"))
    for i in range(len(theirs)):
        d.call("move_email", email_id=ref(c1, i, "email_id"), folder="archive")
    return d.check(*(eq(("messages", e, "folder"), "archive") for e in theirs))


def label_and_flag(pick: Pick) -> Draft:
    init = _mailbox(pick)
    eid, message = pick.choice(list(init["messages"].items()))
    label = pick.choice(LABELS)
    d = Draft(f"Label the email '{message['subject']}' as '{label}' and move it to the important folder.", init)
    c0 = d.call("search_emails", subject_contains=message["subject"])
    d.call("add_label", email_id=ref(c0, 0, "email_id"), label=label)
    d.call("move_email", email_id=ref(c0, 0, "email_id"), folder="important")
    return d.check(contains(("messages", eid, "labels"), label), eq(("messages", eid, "folder"), "important"))


DOMAIN = Domain(
    name="email", env_class=EmailEnv,
    introduction="The mailbox of me@mail.example, with an address book.",
    rules=("Sent emails stay in the sent folder.", "Addresses come from the address book."),
    kinds=(reply, archive_sender, label_and_flag),
)
