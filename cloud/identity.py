"""``python -m rubberband.cloud.identity``: the head identities' policies of every cloud, as docs/clouds.md prints
them (between its ``policies`` markers; ``tests/test_cloud_identity.py`` checks the page holds this text).

Each cloud's package holds its own identity (``cloud/aws/identity.py``, ``cloud/gcp/identity.py``); this module only
gathers their documents through the registry.
"""

from __future__ import annotations

import sys

from rubberband.cloud.registry import DESCRIPTORS


def policy_docs() -> str:
    """Every cloud's policies, one cloud after another (the registry's order)."""
    return "\n\n".join(d.head.policy_docs() for d in DESCRIPTORS.values() if d.head is not None)


def main(argv: list[str]) -> int:
    if argv:
        print(
            "usage: python -m rubberband.cloud.identity (the AWS boundary: python -m rubberband.cloud.aws.identity "
            "boundary)",
            file=sys.stderr,
        )
        return 2
    print(policy_docs())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
