"""mkdocs hooks (mkdocs.yml `hooks:`): the pages the site makes from other sources at every build, so they
cannot drift from them and none is committed:

- index.md, the site's home, is the README with its links into docs/ made relative to the site;
- reference/cli.md from the typer app the `ascend-fleet` command runs (ascend_fleet.cli.build_app);
- reference/host-data.md from the pydantic model every host's data is validated by (hostdata.NodeConfig);
- reference/alerts.md from the Prometheus rules template the monitoring stage installs, rendered with the
  defaults of host data `monitoring`.
"""

from __future__ import annotations

import html
import re
import typing
from pathlib import Path

import typer.main
import yaml
from mkdocs.structure.files import File
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ascend_fleet.cli import build_app
from ascend_fleet.config.hostdata import Monitoring, NodeConfig
from ascend_fleet.core.templating import render
from ascend_fleet.stages.monitoring import MONITORING_TEMPLATES

REPOSITORY = Path(__file__).resolve().parent.parent
RULES_TEMPLATE = MONITORING_TEMPLATES / "ascend-fleet.rules.yml.j2"
CODE_SPAN = re.compile(r"(`[^`]*`)")


def on_files(files, config):
    pages = {"index.md": home_page(), "reference/cli.md": cli_page(), "reference/host-data.md": host_data_page(),
             "reference/alerts.md": alerts_page()}
    for src_uri, content in pages.items():
        files.append(File.generated(config, src_uri, content=content))
    return files


def home_page() -> str:
    """The README, whose links into docs/ work on a git host, with those links relative to the site."""
    readme = (REPOSITORY / "README.md").read_text()
    return re.sub(r"\]\(docs/", "](", readme)


def text(value: str) -> str:
    """Plain text for a table cell: <, > and & shown as written (a <path> is no HTML tag), a | no column,
    code spans kept as they are."""
    parts = CODE_SPAN.split(value.replace("\n", " "))
    return "".join(part if CODE_SPAN.fullmatch(part) else html.escape(part, quote=False).replace("|", "&#124;")
                   for part in parts)


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# The CLI

def cli_page() -> str:
    root = typer.main.get_command(build_app())
    sections = ["# Command line: `ascend-fleet`",
                "Made from the command's own definitions at every build of this site: what `--help` says, "
                "every command on one page."]
    sections += command_sections(root, None, "ascend-fleet")
    return "\n\n".join(sections) + "\n"


def command_sections(command, parent, name: str) -> list[str]:
    context = command.context_class(command, info_name=name, parent=parent)
    level = "#" * min(2 + context.command_path.count(" "), 4)
    usage = command.get_usage(context).removeprefix("Usage: ")
    rows = [(f"`{record[0]}`", text(record[1])) for param in command.get_params(context)
            if (record := param.get_help_record(context))]
    sections = [f"{level} `{context.command_path}`", f"    {usage}", text_block(command.help or ""),
                table(("argument or option", "what"), rows)]
    if hasattr(command, "list_commands"):
        for sub in command.list_commands(context):
            sections += command_sections(command.get_command(context, sub), context, sub)
    return [section for section in sections if section]


def text_block(help_text: str) -> str:
    """A command's help: its paragraphs as Markdown paragraphs, each line's angle brackets shown."""
    paragraphs = [" ".join(line.strip() for line in paragraph.splitlines()).replace("\b", "").strip()
                  for paragraph in help_text.split("\n\n")]
    return "\n\n".join(text(paragraph) for paragraph in paragraphs if paragraph)


# Host data

def host_data_page() -> str:
    sections = ["# Host data keys",
                "Every key a host's data may set (inventory host data, `group_data/*.py`, or `--data KEY=VALUE`), "
                "as the model every deploy and `ascend-fleet check` validate it by "
                "(`ascend_fleet.config.hostdata.NodeConfig`) says, made from that model at every build of this site. "
                "A key it does not list is refused, naming the nearest it does. pyinfra's own connection keys "
                "(`ssh_hostname`, `ssh_user`, `ssh_config_file`, ...) are pyinfra's and are not listed here.",
                model_section(NodeConfig, "`NodeConfig`: a host")]
    seen = {NodeConfig}
    for model in nested_models(NodeConfig, seen):
        sections.append(model_section(model, f"`{model.__name__}`"))
    return "\n\n".join(sections) + "\n"


def nested_models(model: type[BaseModel], seen: set) -> list[type[BaseModel]]:
    """The models the fields of `model` hold, depth first, each once."""
    found = []
    for field in model.model_fields.values():
        for inner in models_in(field.annotation):
            if inner not in seen:
                seen.add(inner)
                found += [inner, *nested_models(inner, seen)]
    return found


def models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in typing.get_args(annotation) for model in models_in(argument)]


def literals_in(annotation) -> list:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [value for argument in typing.get_args(annotation) for value in literals_in(argument)]


def model_section(model: type[BaseModel], title: str) -> str:
    doc = " ".join((model.__doc__ or "").split())
    rows = [field_row(model, name, field) for name, field in model.model_fields.items()]
    return "\n\n".join(part for part in (f"## {title}", text(doc), table(("key", "type", "default", "what"), rows))
                       if part)


def field_row(model: type[BaseModel], name: str, field) -> tuple[str, ...]:
    values = literals_in(field.annotation)
    kind = ("one of " + ", ".join(f"`{value}`" for value in values) if values
            else f"`{source_annotation(model, name)}`")
    kind += "".join(f" ([keys](#{inner.__name__.lower()}))" for inner in models_in(field.annotation))
    limits = ", ".join(f"{key} {value}" for item in field.metadata for key, value in limit_items(item))
    what = "; ".join(part for part in (field.description and text(field.description), limits and f"({limits})")
                     if part)
    return f"`{name}`", kind, default_text(field), what


def source_annotation(model: type[BaseModel], name: str) -> str:
    """The field's type as its class spells it (hostdata.py postpones annotations: they are that text)."""
    for klass in model.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            annotation = klass.__annotations__[name]
            return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return "?"


def limit_items(item):
    for key in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern"):
        if getattr(item, key, None) is not None:
            symbol = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}.get(key, key.replace("_", " "))
            value = getattr(item, key)
            yield symbol, f"`{value}`" if key == "pattern" else value


def default_text(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        return "see its keys" if isinstance(value, BaseModel) else f"`{value!r}`"
    if field.default is PydanticUndefined or field.default is None:
        return "none"
    return f"`{field.default}`"


# Alerts

def alerts_page() -> str:
    rules = yaml.safe_load(render(RULES_TEMPLATE, monitoring=Monitoring()))
    sections = ["# Alerts",
                "The alert rules the monitoring stage installs on the gateways' Prometheus "
                f"(`{RULES_TEMPLATE.relative_to(REPOSITORY)}`, checked with `promtool` before a reload), "
                "rendered at every build of this site with the defaults of host data "
                "[`monitoring`](host-data.md#monitoring): thresholds and durations are its keys."]
    for group in rules["groups"]:
        for rule in group["rules"]:
            annotations = rule.get("annotations", {})
            sections += [f"## {rule['alert']}",
                         f"Severity **{rule.get('labels', {}).get('severity', 'none')}**; fires after "
                         f"{'`' + rule['for'] + '`' if 'for' in rule else 'its first evaluation'}.",
                         "    " + "\n    ".join(str(rule["expr"]).strip().splitlines()),
                         text(annotations.get("summary", "")), text(annotations.get("description", ""))]
    return "\n\n".join(section for section in sections if section) + "\n"
