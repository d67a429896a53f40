"""Ordering Huawei's version strings. Standard library only: the simulated vendor
packages carry this file to the nodes (ascend_fleet/lab/sim/vendor.py)."""

import re


def version_key(version):
    """Sortable key: numbers compare as numbers, and a release sorts after its RCs (8.0.RC2 < 8.0.0)."""
    return [(1, int(tok)) if tok.isdigit() else (0, tok)
            for tok in re.findall(r"\d+|[a-z]+", version.lower())]


def in_range(version, low, high):
    """Whether `version` lies in [low, high]; bounds are prefixes, so 7.5.99 admits 7.5.99.1."""
    key = version_key(version)
    return key[:len(version_key(low))] >= version_key(low) and key[:len(version_key(high))] <= version_key(high)


def parse_range(text):
    """'[7.0.0,7.5.99]' -> ('7.0.0', '7.5.99')."""
    low, high = text.strip().strip("[]").split(",")
    return low.strip(), high.strip()


def is_ops_era(cann_version):
    """CANN 8.5 renamed the operator kernels package to ops and moved from ascend-toolkit/ to cann/."""
    return version_key(cann_version) >= version_key("8.5")
