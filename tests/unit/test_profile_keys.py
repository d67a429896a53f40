"""A profile's unknown key is named with the key it is close to, and what is missing still said."""

from __future__ import annotations

import shutil

import pytest
import yaml

from ascend_fleet import PROFILES
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.errors import FleetError

NAME = "vllm-ascend-0.13.0"
FILE = "Ascend-cann-toolkit_8.5.0_linux-x86_64.run"


def misspell_driver(raw: dict) -> None:
    raw["stack"]["drivr"] = raw["stack"].pop("driver")


def misspell_a_checksum(raw: dict) -> None:
    raw["packages"]["files"][FILE]["sha265"] = raw["packages"]["files"][FILE].pop("sha256")


def python_one_level_up(raw: dict) -> None:
    raw["python"] = raw["stack"].pop("python")


@pytest.mark.parametrize("change, expected", [
    (misspell_driver, "stack.drivr: unknown key (did you mean `driver`?); stack.driver: missing"),
    (misspell_a_checksum, f"packages.files.{FILE}.sha265: unknown key (did you mean `sha256`?); "
                          f"packages.files.{FILE}.sha256: missing"),
    (python_one_level_up, "python: unknown key (did you mean `stack.python`?); stack.python: missing"),
], ids=["stack.drivr", "sha265", "python one level up"])
def test_a_misspelt_key_is_refused_naming_it_its_suggestion_and_what_is_missing(tmp_path, change, expected):
    shutil.copy(PROFILES / f"{NAME}.yaml", tmp_path)
    profile_file = tmp_path / f"{NAME}.yaml"
    raw = yaml.safe_load(profile_file.read_text())
    change(raw)
    profile_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(FleetError) as caught:
        load_profile(NAME, tmp_path)
    assert str(caught.value) == f"profile {NAME}: {profile_file}: {expected}"
