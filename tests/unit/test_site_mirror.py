"""The site mirror stage's copy of a bundle: a host whose copy has the bundle's manifest is left alone; any
other gets every file, the manifest last (a copy with the manifest is complete)."""

from __future__ import annotations

import json

from pyinfra.facts.files import Sha256File

from ascend_fleet.bundle import MANIFEST
from ascend_fleet.node_layout import SITE_MIRROR_ROOT
from ascend_fleet.operations import bundle
from ascend_fleet.package_index import file_sha256
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
