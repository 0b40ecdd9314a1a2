"""The payload's user error: a routing profile, its packing layout or a routing dump that cannot be
used, said in one line naming the field and the fix."""

from __future__ import annotations

from rl_trainer_bench.errors import UserError


class ProfileError(UserError):
    """A routing profile or routing dump that cannot be used; one line naming the field and the fix."""
