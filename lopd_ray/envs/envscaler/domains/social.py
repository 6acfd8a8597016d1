"""A social network, seen from the logged-in user's account: follows, posts, likes and comments."""
from __future__ import annotations

from typing import Annotated

from lopd_ray.envs.envscaler.core import ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import (Domain, DomainEnv, Draft, Pick, absent, append_once, contains, has,
                                                 match, ref)

TOPICS = ("sourdough", "marathon", "telescope", "bonsai", "chess", "ukulele", "kayaking", "origami", "pottery",
          "birdwatching", "espresso", "climbing")


class SocialEnv(DomainEnv):
    @tool
    def find_user(self, handle: Annotated[str, "the user's handle."]) -> dict:
        """Look a user up by handle (without the @)."""
        bare = handle.lstrip("@")
        user_id, user = self._find("users", f"no user @{bare}", handle=bare)
        return {"user_id": user_id, "handle": user["handle"], "followers": len(user["followers"])}

    @tool
    def get_user_posts(self, user_id: Annotated[str, "the user."]) -> list:
        """A user's posts, newest first."""
        self._get("users", user_id, "user")
        found = [{"post_id": pid, "text": p["text"], "likes": len(p["likes"]), "comments": len(p["comments"])}
                 for pid, p in self.posts.items() if p["author"] == user_id]
        return found[::-1]

    @tool
    def follow_user(self, user_id: Annotated[str, "the user to follow."]) -> dict:
        """Follow a user."""
        user = self._get("users", user_id, "user")
        if user_id == self.me:
            raise ToolError("you cannot follow yourself")
        append_once(user["followers"], self.me)
        return {"user_id": user_id, "following": True}

    @tool
    def like_post(self, post_id: Annotated[str, "the post."]) -> dict:
        """Like a post."""
        likes = append_once(self._get("posts", post_id, "post")["likes"], self.me)
        return {"post_id": post_id, "likes": len(likes)}

    @tool
    def comment_on_post(self, post_id: Annotated[str, "the post."], text: Annotated[str, "the comment."]) -> dict:
        """Comment on a post."""
        self._get("posts", post_id, "post")["comments"].append({"author": self.me, "text": text})
        return {"post_id": post_id}

    @tool
    def create_post(self, text: Annotated[str, "the post text."]) -> dict:
        """Publish a post from your account."""
        return {"post_id": self._insert("posts", "PO", {"author": self.me, "text": text, "likes": [], "comments": []})}

    @tool
    def delete_post(self, post_id: Annotated[str, "the post."]) -> dict:
        """Delete one of your own posts."""
        if self._get("posts", post_id, "post")["author"] != self.me:
            raise ToolError("you can only delete your own posts")
        del self.posts[post_id]
        return {"post_id": post_id, "deleted": True}


def _network(pick: Pick) -> dict:
    names = pick.people(6)
    handles = [f"{n.split()[0].lower()}_{n.split()[1].lower()}{pick.randint(1, 99)}" for n in names]
    users = {uid: {"handle": h, "followers": []} for uid, h in zip(pick.ids("U", 6), handles)}
    posts, ids, topics = {}, iter(pick.ids("PO", 18, digits=3)), list(TOPICS)
    for uid in users:
        for topic in pick.sample(topics, 3):
            posts[next(ids)] = {"author": uid, "text": f"Weekend notes on {topic}: {' '.join(pick.words(4))}.",
                                "likes": [], "comments": []}
    return {"me": next(iter(users)), "users": users, "posts": posts, "next_id": pick.counter()}


def _posts_of(init: dict, uid: str) -> list[str]:
    return [pid for pid, p in init["posts"].items() if p["author"] == uid][::-1]


def follow_and_like(pick: Pick) -> Draft:
    init = _network(pick)
    uid = pick.choice([u for u in init["users"] if u != init["me"]])
    handle, newest = init["users"][uid]["handle"], _posts_of(init, uid)[0]
    d = Draft(f"Follow @{handle} and like their most recent post.", init)
    c0 = d.call("find_user", handle=handle)
    d.call("follow_user", user_id=ref(c0, "user_id"))
    c2 = d.call("get_user_posts", user_id=ref(c0, "user_id"))
    d.call("like_post", post_id=ref(c2, 0, "post_id"))
    return d.check(contains(("users", uid, "followers"), init["me"]), contains(("posts", newest, "likes"), init["me"]))


def post_and_comment(pick: Pick) -> Draft:
    init = _network(pick)
    text = f"Just finished my first {pick.choice(TOPICS)} project!"
    comment = f"Photos soon, {pick.choice(('promise', 'stay tuned', 'watch this space'))}."
    d = Draft(f"Publish a post saying '{text}', then comment '{comment}' on it.", init)
    c0 = d.call("create_post", text=text)
    d.call("comment_on_post", post_id=ref(c0, "post_id"), text=comment)
    return d.check(match("posts", {"author": init["me"], "text": text,
                                   "comments": has({"author": init["me"], "text": comment})}))


def delete_own(pick: Pick) -> Draft:
    init = _network(pick)
    mine = _posts_of(init, init["me"])
    index = pick.randrange(len(mine))
    topic = next(t for t in TOPICS if t in init["posts"][mine[index]]["text"])
    handle = init["users"][init["me"]]["handle"]
    d = Draft(f"You are logged in as @{handle}. Delete your post about {topic}.", init)
    c0 = d.call("find_user", handle=handle)
    c1 = d.call("get_user_posts", user_id=ref(c0, "user_id"))
    d.call("delete_post", post_id=ref(c1, index, "post_id"))
    return d.check(absent(("posts", mine[index])))


def comment_on_topic(pick: Pick) -> Draft:
    init = _network(pick)
    uid = pick.choice([u for u in init["users"] if u != init["me"]])
    theirs = _posts_of(init, uid)
    index = pick.randrange(len(theirs))
    topic = next(t for t in TOPICS if t in init["posts"][theirs[index]]["text"])
    comment = f"Great {topic} tips, thanks!"
    d = Draft(f"Comment '{comment}' on @{init['users'][uid]['handle']}'s post about {topic}.", init)
    c0 = d.call("find_user", handle=init["users"][uid]["handle"])
    c1 = d.call("get_user_posts", user_id=ref(c0, "user_id"))
    d.call("comment_on_post", post_id=ref(c1, index, "post_id"), text=comment)
    return d.check(contains(("posts", theirs[index], "comments"), {"author": init["me"], "text": comment}))


DOMAIN = Domain(
    name="social", env_class=SocialEnv,
    introduction="A social network; you act as the logged-in user.",
    rules=("You can only delete your own posts.", "Handles are written without the @."),
    kinds=(follow_and_like, post_and_comment, delete_own, comment_on_topic),
)
