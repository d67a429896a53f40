"""The manual: the README as the front door, the site (mkdocs.yml) built as a user's `mkdocs build --strict`
builds it, and its reference pages holding what the code holds."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_fleet.cli import COMMANDS
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.stages.monitoring import MONITORING_TEMPLATES

REPOSITORY = Path(__file__).resolve().parents[2]
# A link's target in Markdown, [text](target): the part before any #anchor.
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for the module; a warning (a link or anchor that is not there, a page missing
    from the nav, a generator's error) fails the build."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=REPOSITORY, capture_output=True, text=True,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def test_the_cli_reference_has_every_command(site):
    cli = page(site, "reference/cli")
    missing = [name for name in COMMANDS if f"ascend-fleet {name}</code>" not in cli]
    assert not missing, f"commands missing from the CLI reference: {missing}"
    assert "<code>--max-model-len" in cli  # an option of `plan`, with its help


def test_the_host_data_reference_has_every_key(site):
    keys = page(site, "reference/host-data")
    missing = [name for name in NodeConfig.model_fields if f"<td><code>{name}</code></td>" not in keys]
    assert not missing, f"host data keys missing from the reference: {missing}"
    # A nested model's keys are listed too, with their defaults.
    assert "<td><code>ttft_p99_above_seconds</code></td>\n<td><code>float</code></td>\n<td><code>2.0</code>" in keys


def test_the_alerts_reference_has_every_alert_the_rules_file_has(site):
    rules = (MONITORING_TEMPLATES / "ascend-fleet.rules.yml.j2").read_text()
    alerts = re.findall(r"^\s*- alert: (\w+)$", rules, re.MULTILINE)
    page_text = page(site, "reference/alerts")
    assert alerts and all(f'id="{alert.lower()}"' in page_text for alert in alerts), alerts
    assert "&gt; 0.9" in page_text  # KVCacheNearlyFull's threshold, rendered from Monitoring's default


def test_the_home_page_is_the_readme_with_its_links_into_the_site(site):
    home = page(site, "")
    assert 'href="guides/real-fleet/"' in home and "./scripts/setup" in home


def test_readme_is_a_front_door():
    lines = (REPOSITORY / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; at most 300, the rest in docs/"
    first = "\n".join(lines[:30])
    assert "./scripts/setup" in first and "./scripts/test" in first


def test_readme_links_resolve_on_a_git_host():
    """The README is read on a git host too: each relative link is a file of the repository."""
    targets = [target for target in LINK.findall((REPOSITORY / "README.md").read_text())
               if not re.match(r"[a-z]+:", target)]
    assert targets
    missing = [target for target in targets if not (REPOSITORY / target).is_file()]
    assert not missing, f"README.md links to files that are not there: {missing}"


def test_every_doc_the_code_names_is_there_and_on_the_site():
    """Error messages and help point users at docs/NAME.md: each is a file, and the site's nav lists it."""
    named = {match for path in [*REPOSITORY.glob("ascend_fleet/**/*.py"), *REPOSITORY.glob("tests/**/*.py")]
             for match in re.findall(r"\bdocs/([a-z-]+\.md)\b", path.read_text())}
    assert named
    nav = (REPOSITORY / "mkdocs.yml").read_text()
    assert not [name for name in named if not (REPOSITORY / "docs" / name).is_file()]
    assert not [name for name in named if f"- {name}" not in nav]
