"""HTML and Markdown rendering shared by the report and compare pages.

Pages open from disk: relative links only, CSS inline, no script, no network. Empty numbers render as "—"
(not measured), and a row whose status is not ok is tinted and keeps its reason.
"""

from __future__ import annotations

import html
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench import run_folder
from bench.run_folder import RunError
from bench.schema import CONFIG_KEYS, STRING_COLUMNS

EMPTY = "—"

CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1500px; padding: 0 24px 48px; color: #1d2330; }
h1 { font-size: 24px; margin: 24px 0 4px; } h2 { font-size: 19px; margin-top: 34px;
  border-bottom: 1px solid #d8dce3; padding-bottom: 4px; } h3 { font-size: 15px; margin-bottom: 6px; }
.sub { color: #5b6475; margin-top: 0; } .formula { color: #3a4254; font-style: italic; }
nav { background: #f4f6f9; padding: 8px 12px; border-radius: 6px; margin: 12px 0; }
nav a { margin-right: 14px; white-space: nowrap; }
.findings li { margin: 4px 0; }
.warn { background: #fff4d6; border-left: 4px solid #e0a800; padding: 8px 12px; }
.note { background: #eef3fb; border-left: 4px solid #5b8bd6; padding: 8px 12px; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 4px; }
th, td { border: 1px solid #d8dce3; padding: 3px 7px; text-align: right; white-space: nowrap; }
th.text { text-align: left; }
th { background: #eef0f4; position: sticky; top: 0; white-space: normal; max-width: 110px;
     vertical-align: bottom; } td.text { text-align: left; }
tr.status-bad td { background: #fdecec; } td.status-bad { color: #b3261e; font-weight: 600; }
td.wrap { white-space: normal; min-width: 220px; max-width: 420px; text-align: left; }
img { max-width: 100%; max-height: 260px; border: 1px solid #e3e6ec; margin: 6px 0; }  /* click: full size */
.story img { max-height: none; }
code, pre { background: #f4f6f9; border-radius: 4px; } pre { padding: 8px 12px; overflow-x: auto; }
.csv { font-size: 12px; margin-bottom: 0; }
.same { font-size: 12.5px; color: #3a4254; margin: 2px 0; } .empty { color: #5b6475; }
details { margin: 6px 0; } summary { cursor: pointer; color: #27466e; }
.answer { font-size: 17px; font-weight: 600; margin: 8px 0; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 10px 0; }
.card { border: 1px solid #d8dce3; border-radius: 6px; padding: 8px 12px; min-width: 220px; flex: 1; }
.card .big { font-size: 22px; font-weight: 600; } .card .lbl { color: #5b6475; font-size: 12.5px; }
.story { display: flex; gap: 12px; } .story p { flex: 1; margin: 0; }
.verdict { display: flex; gap: 12px; align-items: flex-start; } .verdict .cards { flex: 1; margin: 0; }
.verdict p { flex: 1; margin: 0; } .verdict img { max-height: 330px; margin: 0; }
a.cell { font-size: 11px; color: #5b6475; }
"""
FORMULAS = '<details class="formulas"><summary>Definitions</summary>'
# Tables longer than this are collapsed behind a one-line summary; wider ones show their key columns first.
COLLAPSE_ROWS = 15
WIDE_COLUMNS = 12

# Left-aligned columns: the run's text columns plus the ones the report's own tables add.
TEXT_COLUMNS = set(STRING_COLUMNS) | {
    "note", "reason", "field", "value", "presence", "run_a", "run_b", "traces",
}
# Configuration columns that a table may state once ("Every row: …") when they never change in it.
HOISTABLE = set(CONFIG_KEYS) | {"run_a", "run_b", "device", "torch_bucket_cap_mb"}
WRAP_COLUMNS = {"note", "reason", "error", "traces"}


def fmt(value, column: str = "") -> str:
    """A cell as text: "—" for not measured, integers without decimals, readable precision otherwise."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        v = float(value)
        if (
            v.is_integer()
            and abs(v) < 1e15
            and not column.endswith(("_pct", "_x", "_ms", "_ms_p50", "_ms_p90"))
        ):
            return f"{int(v):,}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.1f}" if column.endswith("_pct") else f"{v:.2f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"
    return str(value)


def html_table(df: pd.DataFrame, links: dict[str, str] | None = None, cell_rows: bool = False) -> str:
    """An HTML table; `links` maps a cell_id to HTML for a "traces" column placed right after cell_id.
    `cell_rows`: this is the table of every cell, each row the target `#cell-<id>` of the links to it
    (`link_cells`)."""
    if not len(df):
        return '<p class="empty">(no rows)</p>'
    # The traces column follows cell_id (the cell it belongs to), or ends the row when there is none.
    at = list(df.columns).index("cell_id") + 1 if "cell_id" in df else len(df.columns)
    cols = list(df.columns)[:at] + (["traces"] if links is not None else []) + list(df.columns)[at:]
    # Long unit-carrying names may break after an underscore, so number columns stay narrow.
    head = "".join(
        f"<th{' class=text' if c in TEXT_COLUMNS else ''}>{html.escape(c).replace('_', '_<wbr>')}</th>"
        for c in cols
    )
    body = []
    for _, r in df.iterrows():
        status_cols = [c for c in df.columns if c.startswith("status")]  # compare tables: status_a, status_b
        bad_cols = {c for c in status_cols if r[c] not in ("ok", "raced_out", "")}
        bad = bool(bad_cols)
        cells = []
        for c in cols:
            if c == "traces" and links is not None:
                cells.append(f'<td class="text">{links.get(r.get("cell_id", ""), "")}</td>')
                continue
            cls = ["text"] if c in TEXT_COLUMNS or isinstance(r[c], str) else []
            cls += ["wrap"] if c in WRAP_COLUMNS else []
            cls += ["status-bad"] if c in bad_cols else []
            cls += ["home"] if cell_rows and c == "cell_id" else []  # the id's home: text, not a link
            attr = f' class="{" ".join(cls)}"' if cls else ""
            cells.append(f"<td{attr}>{html.escape(fmt(r[c], c)).replace(chr(10), '<br>')}</td>")
        row_id = f' id="cell-{html.escape(str(r["cell_id"]))}"' if cell_rows and "cell_id" in df else ""
        body.append(f"<tr{row_id}{' class=status-bad' if bad else ''}>{''.join(cells)}</tr>")
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f'<div class="scroll">{table}</div>'


def key_columns(df: pd.DataFrame) -> list[str]:
    """What a wide table shows before its toggle: the configuration, status, the first measured columns,
    the note and the cell id."""
    config = [c for c in df.columns if c in HOISTABLE or c == "status"]
    measured = [c for c in df.columns if c not in config and c not in WRAP_COLUMNS | {"cell_id", "error"}][:4]
    tail = [c for c in ("note", "reason", "cell_id") if c in df.columns]
    return [c for c in df.columns if c in set(config + measured + tail)]


def link_cells(page: str, cell_ids: set[str]) -> str:
    """Every table cell holding just a cell id becomes a link to that cell's row in the table of every cell
    (`html_table(cell_rows=True)`): the configuration is read from the labelled columns, the id is a link."""
    def link(m: re.Match) -> str:
        cell = html.unescape(m.group(1))
        return (f'<td class="text"><a class="cell" href="#cell-{m.group(1)}">{m.group(1)}</a></td>'
                if cell in cell_ids else m.group(0))

    return re.sub(r'<td class="text">([^<]+)</td>', link, page)


def collapsed(df: pd.DataFrame, links: dict[str, str] | None, csv_rel: str | None, summary: str,
              cell_rows: bool = False) -> str:
    """The table as HTML for reading: a wide one shows key_columns and keeps the rest behind "all N columns";
    a long one sits in a closed <details> whose summary line says what it holds and links its CSV."""
    body = html_table(df, links, cell_rows)
    keys = key_columns(df)
    if len(df.columns) > WIDE_COLUMNS and len(keys) < len(df.columns):
        body = (html_table(df[keys], links, cell_rows) + f"<details><summary>all {len(df.columns)} columns "
                f"({len(df.columns) - len(keys)} more)</summary>{html_table(df)}</details>")
    if len(df) <= COLLAPSE_ROWS:
        return body
    line = f"{len(df)} rows" + (f", {html.escape(summary)}" if summary else "")
    csv = f' · CSV: <a href="{html.escape(csv_rel)}">{html.escape(csv_rel)}</a>' if csv_rel else ""
    return f"<details><summary>{line}: show the table{csv}</summary>{body}</details>"


def md_text(text: str) -> str:
    """Prose for Markdown (report.md, summary.md) from data a user wrote (a model size, a description, an
    error): raw HTML shown as text, not rendered (`<`, `>`, `&` escaped), as index.html shows it."""
    return html.escape(str(text), quote=False)


def md_cell(text: str) -> str:
    """A table cell's text for Markdown: md_text, `|` escaped so the row keeps its columns, line breaks as
    <br>."""
    return md_text(text).replace("|", "\\|").replace("\n", "<br>")


def md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency)."""
    if not len(df):
        return "(no rows)\n"
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append(
            "| " + " | ".join(md_cell(fmt(r[c], c)) for c in cols) + " |"
        )
    return "\n".join(lines) + "\n"


@dataclass
class Section:
    """One titled part of a page: paragraphs (already HTML / Markdown), tables, images."""

    title: str
    anchor: str
    html: list[str] = field(default_factory=list)
    md: list[str] = field(default_factory=list)

    def para(self, text: str, cls: str = "") -> Section:
        """A paragraph; consecutive definitions (cls "formula") share one closed "Definitions" toggle."""
        attr = f' class="{cls}"' if cls else ""
        if cls == "formula":
            inner = f"<p{attr}>{html.escape(text)}</p></details>"
            if self.html and self.html[-1].startswith(FORMULAS):
                self.html[-1] = self.html[-1].removesuffix("</details>") + inner
            else:
                self.html.append(FORMULAS + inner)
            self.md.append(md_text(text) + "\n")
            return self
        self.html.append(f"<p{attr}>{html.escape(text)}</p>")
        self.md.append(("> " if cls in ("warn", "note") else "") + md_text(text) + "\n")
        return self

    def bullets(self, items: list[str], cls: str = "") -> Section:
        if items:
            lis = "".join(f"<li>{html.escape(s)}</li>" for s in items)
            self.html.append(f'<ul class="{cls}">{lis}</ul>')
            self.md.append("\n".join(f"- {md_text(s)}" for s in items) + "\n")
        return self

    def table(
        self,
        df: pd.DataFrame,
        csv_rel: str | None = None,
        links: dict[str, str] | None = None,
        md_columns: list[str] | None = None,
        summary: str = "",
        cell_rows: bool = False,
    ) -> Section:
        """The table (and a link to its CSV, which keeps every column). Configuration columns that hold one
        value in every row are said once above the table instead of repeated down a column. A long table is
        collapsed behind `summary` and its row count, a wide one shows its key columns first (`collapsed`)."""
        if md_columns:
            df = df[md_columns]
        constant = [
            c for c in df.columns if c in HOISTABLE and len(df) > 1 and len({fmt(v, c) for v in df[c]}) == 1
        ]
        if csv_rel:
            self.html.append(
                f'<p class="csv">CSV: <a href="{html.escape(csv_rel)}">{html.escape(csv_rel)}</a></p>'
            )
            self.md.append(f"CSV: [{csv_rel}]({csv_rel})\n")
        if constant:
            same = " · ".join(f"{c} {fmt(df[c].iloc[0], c)}" for c in constant)
            self.html.append(f'<p class="same">Every row: {html.escape(same)}</p>')
            self.md.append(f"Every row: {md_text(same)}\n")
            df = df.drop(columns=constant)
        self.html.append(collapsed(df, links, csv_rel, summary, cell_rows))
        self.md.append(md_table(df))
        return self

    def image(self, rel: str, alt: str) -> Section:
        self.html.append(
            f'<p><a href="{html.escape(rel)}"><img src="{html.escape(rel)}" alt="{html.escape(alt)}"></a></p>'
        )
        self.md.append(f"![{md_text(alt)}]({rel})\n")
        return self

    def code(self, text: str) -> Section:
        self.html.append(f"<pre><code>{html.escape(text)}</code></pre>")
        self.md.append(f"```\n{text}\n```\n")
        return self

    def raw(self, html_text: str, md_text: str) -> Section:
        self.html.append(html_text)
        self.md.append(md_text)
        return self


# What a page (bench report, bench compare) writes into its folder: write_page's three files and the folders
# of its tables, figures and trace comparisons.
PAGE_FILES = ("index.html", "report.md", "summary.md")
PAGE_FOLDERS = ("tables", "plots", "traces")


def page_folder(out_dir: Path, command: str):
    """A context giving the folder to write a new page into (run_folder.writing with `page`): `out_dir`
    must be new, empty or a page this command wrote there (its marker says so), never a folder because
    its entries have a page's names. When the block ends the new page replaces the earlier one's files,
    and nothing else is touched. RunError, with nothing touched, when it holds anything else (a user's
    files, another command's output) or is another command's part of a run folder."""
    try:
        run_folder.check_out(out_dir, command, names=PAGE_FILES + PAGE_FOLDERS, page=True)
    except run_folder.OutError as exc:
        raise RunError(str(exc)) from None
    return _refusals_as_run_errors(run_folder.writing(out_dir, command, names=PAGE_FILES + PAGE_FOLDERS,
                                                      page=True))


@contextmanager
def _refusals_as_run_errors(context):
    try:
        with context as stage:
            yield stage
    except run_folder.OutError as exc:
        raise RunError(str(exc)) from None


def write_page(out_dir: Path, title: str, subtitle: str, sections: list[Section],
               summary: list[Section] | None = None, cell_ids: set[str] | None = None) -> Path:
    """Write index.html and report.md (every section) and summary.md (the `summary` sections, else every
    one); returns the index.html path."""
    nav = " ".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in sections)
    body = "".join(
        f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>{"".join(s.html)}</section>'
        for s in sections
    )
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
        f'<body><h1>{html.escape(title)}</h1><p class="sub">{html.escape(subtitle)}</p><nav>{nav}</nav>'
        f"{body}</body></html>\n"
    )
    if cell_ids:
        page = link_cells(page, cell_ids)
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    (out_dir / "report.md").write_text(markdown(title, subtitle, sections), encoding="utf-8")
    short = markdown(title, subtitle, summary) + "\nThe whole report: index.html (report.md in Markdown).\n" \
        if summary is not None else markdown(title, subtitle, sections)
    (out_dir / "summary.md").write_text(short, encoding="utf-8")
    return index


def markdown(title: str, subtitle: str, sections: list[Section]) -> str:
    md = [f"# {md_text(title)}\n", f"{md_text(subtitle)}\n"]
    for s in sections:
        md.append(f"## {md_text(s.title)}\n")
        md.extend(s.md)
    return "\n".join(md)


# Counts and configuration values that are whole numbers by nature; measured times stay as measured.
INTEGER_COLUMNS = {
    "world_size",
    "grad_accum",
    "per_rank_batch",
    "global_batch",
    "n_timed_steps",
    "n_buckets",
    "n_params",
    "seq_len",
    "threads_per_rank",
    "packed_launches",
    "allreduce_bytes",
    "bucket_cap_mb",
    "torch_bucket_cap_mb",
    "GPU count",
}


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    """Write `df` as CSV, whole-number configuration columns as integers (world_size 4, not 4.0)."""
    out = df.copy()
    for c in INTEGER_COLUMNS & set(out.columns):
        values = pd.to_numeric(out[c], errors="coerce")
        known = values.dropna()
        if len(known) and known.eq(known.round()).all() and len(known) == out[c].notna().sum():
            out[c] = values.astype("Int64")
    path.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(path, index=False)
    return path
