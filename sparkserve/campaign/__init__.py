"""Stage 8 — campaign: the card's A/B program run on a live stack — boot A, bench, swap to B, bench, in the
interleaved order (or, with replicas, A and B at once on replicas of their own, crossed over round by round),
journalled cell by cell, with the report of record at the end.

It drives ``up`` and ``swap-drafter`` (deploy/) and the bench protocols (measure/), so it stands above
deploy/, beside operate/: measure/ is below deploy/ and may not reach back up to it.

May import: ``deploy`` and every stage below it, and the ground modules. Never ``operate`` or the CLI.
"""
