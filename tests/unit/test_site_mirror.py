"""The site mirror stage's copy of a bundle: a host whose copy has the bundle's manifest is left alone; any
other gets every file, the manifest last (a copy with the manifest is complete)."""

from __future__ import annotations

import hashlib
import json

import pytest
from pyinfra.api import State, StringCommand
from pyinfra.facts.files import Sha256File
from pyinfra.facts.rpm import RpmPackages

from ascend_fleet.config.node_os import node_os
from ascend_fleet.core.bundle_layout import MANIFEST, listed_sha256
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import BUNDLE_APT_SOURCE, SITE_MIRROR_ROOT
from ascend_fleet.core.package_index import file_sha256
from ascend_fleet.fleet.bundle import bundle_os
from ascend_fleet.operations import bundle
from tests.fakehost import FakeHost, commands, fact, new_file, uploads


def small_bundle(tmp_path):
    (tmp_path / "packages").mkdir()
    (tmp_path / "packages" / "a-1-py3-none-any.whl").write_bytes(b"a")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "x.run").write_bytes(b"x")
    listed = {name: file_sha256(tmp_path / name) for name in ("packages/a-1-py3-none-any.whl", "files/x.run")}
    (tmp_path / MANIFEST).write_text(json.dumps({"platforms": [], "files": listed}))
    return tmp_path


def test_a_copy_with_the_bundles_manifest_is_left_alone(tmp_path):
    out = small_bundle(tmp_path)
    remote = f"{SITE_MIRROR_ROOT}/{MANIFEST}"
    fake = FakeHost({fact(Sha256File, path=remote): file_sha256(out / MANIFEST)})
    assert commands(bundle.served, fake, bundle=out, dest=SITE_MIRROR_ROOT) == []
    assert fake.noops == [f"the bundle of {out / MANIFEST} is served from {SITE_MIRROR_ROOT}"]


def test_any_other_copy_gets_every_file_and_the_manifest_last(tmp_path):
    out = small_bundle(tmp_path)
    names = ["packages/a-1-py3-none-any.whl", "files/x.run", MANIFEST]
    answers = {fact(Sha256File, path=f"{SITE_MIRROR_ROOT}/{MANIFEST}"): "0" * 64}
    for name in names:
        answers.update(new_file(f"{SITE_MIRROR_ROOT}/{name}"))
    steps = commands(bundle.served, FakeHost(answers), bundle=out, dest=SITE_MIRROR_ROOT)
    put = uploads(steps)
    assert list(put) == [f"{SITE_MIRROR_ROOT}/{name}" for name in names]
    assert put[f"{SITE_MIRROR_ROOT}/files/x.run"] == b"x"


def test_dnf_installs_only_what_is_missing_from_the_bundles_repository_alone():
    fake = FakeHost({RpmPackages: {"nginx": ["1.24.0-10.oe2403"]}})
    steps = commands(bundle.dnf_packages, fake, packages=["nginx", "nftables"], repository="ascend-fleet-bundle")
    assert list(map(str, steps)) == ["dnf install -y '--disablerepo=*' --enablerepo=ascend-fleet-bundle nftables"]
    assert commands(bundle.dnf_packages, fake, packages=["nginx"], repository="ascend-fleet-bundle") == []
    assert fake.noops == ["nginx installed"]


def test_the_bundles_apt_source_is_read_alone_before_it_goes_in_place_and_not_again_when_it_is_there():
    source = "deb [trusted=yes] http://gateway:8070/os/debian-12-x86_64 ./\n"
    path = BUNDLE_APT_SOURCE
    there = FakeHost({fact(Sha256File, path=path): hashlib.sha256(source.encode()).hexdigest()})
    assert commands(bundle.apt_repository, there, source=source, path=path) == []
    steps = commands(bundle.apt_repository, FakeHost({fact(Sha256File, path=path): None, **new_file(f"{path}.new")}),
                     source=source, path=path)
    assert list(uploads(steps)) == [f"{path}.new"]
    assert [str(step) for step in steps if isinstance(step, StringCommand)][-2:] == [
        f"apt-get -q update -oDir::Etc::sourcelist={path}.new -oDir::Etc::sourceparts=- -oAPT::Get::List-Cleanup=0",
        f"mv -f {path}.new {path}"]


@pytest.mark.parametrize("archive", ["http://mirror/debian\ndeb http://evil/ ./", "http://mirror/de bian",
                                     "http://mirror/$basearch", 'http://mirror/"debian', "http://mirror/a'b",
                                     "ftp://mirror/debian"])
def test_an_archive_url_a_sources_file_or_a_dnf_repository_would_read_otherwise_is_refused_before_any_download(
        archive, tmp_path):
    with pytest.raises(FleetError) as refused:
        bundle_os(State(), node_os("Debian", "12"), "x86_64", [], False, archive, [], tmp_path, print)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("bundle: --os 'Debian 12': archive ") and line.endswith(
        "is not an http(s) or file URL without blanks, quotes, $ or `; give the release's archive after the =")
    assert not (tmp_path / "os").exists()


@pytest.mark.parametrize("digest", ["ab" * 32 + "\ndeb http://evil/ ./", "%s;'\" x", "AB" * 32])
def test_a_manifest_digest_that_is_not_a_sha256_never_reaches_a_package_source(digest, tmp_path):
    (tmp_path / MANIFEST).write_text(json.dumps({"files": {"os/debian-12-x86_64/Release": digest}}))
    with pytest.raises(FleetError, match=f"^bundle {tmp_path}: {MANIFEST} lists os/debian-12-x86_64/Release with "):
        listed_sha256(tmp_path, "os/debian-12-x86_64/Release")
