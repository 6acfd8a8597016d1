"""Bank accounts: look accounts up by owner, move money, freeze accounts."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, DomainEnv, Draft, Pick, eq, match, ref, set_fields

Kind = Literal["checking", "savings"]


class BankEnv(DomainEnv):
    def _open(self, account_id: str) -> dict:
        return self._get_in_state("accounts", account_id, "account", f"account '{account_id}' is frozen",
                                  frozen=False)

    @staticmethod
    def _positive(amount: int) -> None:
        if amount <= 0:
            raise ToolError("amount must be a positive whole number of dollars")

    def _add_to_balance(self, account_id: str, delta: int) -> dict:
        """Adds `delta` dollars (negative: takes them) to an open account, which must not go below zero."""
        account = self._open(account_id)
        if account["balance"] + delta < 0:
            raise ToolError("insufficient funds")
        account["balance"] += delta
        return {"account_id": account_id, "balance": account["balance"]}

    @tool
    def find_accounts(self, owner: Annotated[str, "full name of the account holder."],
                      kind: Annotated[Optional[Kind], "only accounts of this kind."] = None) -> list:
        """List the accounts of a customer."""
        found = [{"account_id": aid, "kind": a["kind"], "balance": a["balance"], "frozen": a["frozen"]}
                 for aid, a in self.accounts.items() if a["owner"] == owner and kind in (None, a["kind"])]
        if not found:
            raise ToolError(f"no {kind + ' ' if kind else ''}account held by '{owner}'")
        return found

    @tool
    def get_balance(self, account_id: Annotated[str, "the account id."]) -> dict:
        """Current balance of an account."""
        return {"account_id": account_id, "balance": self._get("accounts", account_id, "account")["balance"]}

    @tool
    def deposit(self, account_id: Annotated[str, "the account id."],
                amount: Annotated[int, "dollars to deposit."]) -> dict:
        """Deposit money into an account."""
        self._positive(amount)
        return self._add_to_balance(account_id, amount)

    @tool
    def withdraw(self, account_id: Annotated[str, "the account id."],
                 amount: Annotated[int, "dollars to withdraw."]) -> dict:
        """Withdraw cash from an account."""
        self._positive(amount)
        return self._add_to_balance(account_id, -amount)

    @tool
    def transfer(self, from_account_id: Annotated[str, "the account to debit."],
                 to_account_id: Annotated[str, "the account to credit."],
                 amount: Annotated[int, "dollars to move."]) -> dict:
        """Move money between two accounts."""
        self._positive(amount)
        source, target = self._open(from_account_id), self._open(to_account_id)
        if from_account_id == to_account_id:
            raise ToolError("the two accounts must differ")
        if source["balance"] < amount:
            raise ToolError("insufficient funds")
        source["balance"] -= amount
        target["balance"] += amount
        transfer_id = self._new_id("TR")
        self.transfers.append({"transfer_id": transfer_id, "from": from_account_id, "to": to_account_id,
                               "amount": amount})
        return {"transfer_id": transfer_id, "from_balance": source["balance"], "to_balance": target["balance"]}

    freeze_account = set_fields("accounts", "account", "Freeze an account so that no money can move in or out.",
                                "the account id.", frozen=True)


def _bank(pick: Pick) -> tuple[dict, list[str], dict[tuple[str, str], str]]:
    owners = pick.people(5)
    ids = pick.ids("AC", 2 * len(owners))
    accounts, by_owner = {}, {}
    for i, owner in enumerate(owners):
        for j, kind in enumerate(("checking", "savings")):
            aid = ids[2 * i + j]
            accounts[aid] = {"owner": owner, "kind": kind, "balance": pick.randint(200, 5000), "frozen": False}
            by_owner[(owner, kind)] = aid
    return {"accounts": accounts, "transfers": [], "next_id": pick.counter()}, owners, by_owner


def transfer_between_people(pick: Pick) -> Draft:
    init, owners, acct = _bank(pick)
    a, b = owners[:2]
    src, dst = acct[(a, "checking")], acct[(b, "savings")]
    amount = pick.randint(10, init["accounts"][src]["balance"] - 1)
    d = Draft(f"Transfer ${amount} from {a}'s checking account to {b}'s savings account.", init)
    c0 = d.call("find_accounts", owner=a, kind="checking")
    c1 = d.call("find_accounts", owner=b, kind="savings")
    d.call("transfer", from_account_id=ref(c0, 0, "account_id"), to_account_id=ref(c1, 0, "account_id"),
           amount=amount)
    return d.check(eq(("accounts", src, "balance"), init["accounts"][src]["balance"] - amount),
                   eq(("accounts", dst, "balance"), init["accounts"][dst]["balance"] + amount),
                   match("transfers", {"from": src, "to": dst, "amount": amount}))


def deposit_and_freeze(pick: Pick) -> Draft:
    init, owners, acct = _bank(pick)
    a = owners[0]
    sav, chk = acct[(a, "savings")], acct[(a, "checking")]
    amount = pick.randint(20, 900)
    d = Draft(f"Deposit ${amount} into {a}'s savings account, then freeze {a}'s checking account.", init)
    c0 = d.call("find_accounts", owner=a, kind="savings")
    d.call("deposit", account_id=ref(c0, 0, "account_id"), amount=amount)
    c2 = d.call("find_accounts", owner=a, kind="checking")
    d.call("freeze_account", account_id=ref(c2, 0, "account_id"))
    return d.check(eq(("accounts", sav, "balance"), init["accounts"][sav]["balance"] + amount),
                   eq(("accounts", chk, "frozen"), True))


def sweep_savings(pick: Pick) -> Draft:
    init, owners, acct = _bank(pick)
    a = owners[0]
    sav, chk = acct[(a, "savings")], acct[(a, "checking")]
    s, c = init["accounts"][sav]["balance"], init["accounts"][chk]["balance"]
    d = Draft(f"Move the entire balance of {a}'s savings account into {a}'s checking account.", init)
    c0 = d.call("find_accounts", owner=a, kind="savings")
    c1 = d.call("find_accounts", owner=a, kind="checking")
    d.call("transfer", from_account_id=ref(c0, 0, "account_id"), to_account_id=ref(c1, 0, "account_id"),
           amount=ref(c0, 0, "balance"))
    return d.check(eq(("accounts", sav, "balance"), 0), eq(("accounts", chk, "balance"), s + c),
                   match("transfers", {"from": sav, "to": chk, "amount": s}))


def withdraw_from_larger(pick: Pick) -> Draft:
    init, owners, acct = _bank(pick)
    a = owners[0]
    ids = [acct[(a, "checking")], acct[(a, "savings")]]
    if init["accounts"][ids[0]]["balance"] == init["accounts"][ids[1]]["balance"]:
        init["accounts"][ids[1]]["balance"] += 1
    index = max((0, 1), key=lambda i: init["accounts"][ids[i]]["balance"])
    amount = pick.randint(20, 150)
    d = Draft(f"{a} wants to withdraw ${amount} in cash from whichever of their two accounts holds more money.",
              init)
    c0 = d.call("find_accounts", owner=a)
    d.call("withdraw", account_id=ref(c0, index, "account_id"), amount=amount)
    return d.check(eq(("accounts", ids[index], "balance"), init["accounts"][ids[index]]["balance"] - amount))


DOMAIN = Domain(
    name="bank", env_class=BankEnv,
    introduction="A retail bank's back office. Every customer holds a checking and a savings account.",
    rules=("Amounts are whole dollars.", "Money cannot move in or out of a frozen account.",
           "An account cannot go below zero."),
    kinds=(transfer_between_people, deposit_and_freeze, sweep_savings, withdraw_from_larger),
)
