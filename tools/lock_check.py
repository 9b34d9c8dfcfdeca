"""Check requirements.lock on one platform without that platform: keep the lines whose environment
markers hold there (Python 3.11), have pip download exactly those files for the platform's wheel
tags with ``--require-hashes``, unpack every wheel (a wheel is a zip) and measure the folder.

    python tools/lock_check.py macos-arm64 linux-aarch64 linux-x86_64 --out reports/lock/sizes.json
    python tools/lock_check.py --docs      # the sizes table of docs/install.md, from that JSON
    python tools/lock_check.py --pins-only linux-x86_64 linux-aarch64 macos-arm64   # no download

A pinned package with no wheel for the platform is downloaded as its source archive and listed
under ``sdists`` (it is built on install); a hash or a version the index does not have fails pip.
The downloads are deleted afterwards; the JSON records the command, pip, date and machine.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import typer
from packaging.markers import Marker

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
HERE = platform.python_version()  # the default Python the markers and wheel tags are evaluated for
# marker environment and pip --platform tags of each platform requirements.lock is resolved for
# (pyproject.toml [tool.uv] environments); glibc 2.28 and macOS 14 are the oldest systems checked
PLATFORMS = {
    "linux-x86_64": ({"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}, "x86_64"),
    "linux-aarch64": ({"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"}, "aarch64"),
    "macos-arm64": ({"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"}, "arm64"),
}
CUDA = re.compile(r"^(nvidia-(?!ml-py)|cuda-|triton$)")  # the GPU runtime PyPI's Linux torch wheels pull in
LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?:\s*;\s*(?P<marker>.*?))?\s*\\?$")
SIZES, DOCS = ROOT / "reports" / "lock" / "sizes.json", ROOT / "docs" / "install.md"
START = "<!-- sizes table: generated from reports/lock/sizes.json by tools/lock_check.py --docs -->"
END = "<!-- end of sizes table -->"
HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def pip_platforms(key: str) -> list[str]:
    """pip ``--platform`` tags (pip expands a macOS tag to older releases, not a manylinux one)."""
    arch = PLATFORMS[key][1]
    if key.startswith("macos"):
        return [f"macosx_14_0_{arch}"]
    return [f"manylinux_2_{minor}_{arch}" for minor in range(28, 16, -1)] + [f"manylinux2014_{arch}"]


def environment(key: str, full_version: str) -> dict[str, str]:
    if key not in PLATFORMS:
        raise SystemExit(f"error: platform: expected one of {sorted(PLATFORMS)}, got {key!r}")
    return {
        **PLATFORMS[key][0],
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "python_version": ".".join(full_version.split(".")[:2]),
        "python_full_version": full_version,
    }


def requirements(lock_text: str) -> list[dict]:
    """The lock's entries: name, version, marker (or None) and hashes."""
    out: list[dict] = []
    for line in lock_text.splitlines():
        if (match := LINE.match(line)) is not None:
            out.append({**match.groupdict(), "hashes": []})
        elif out and (found := HASH.search(line)):
            out[-1]["hashes"].append(found.group(1))
    return out


def for_platform(entries: list[dict], key: str, full_version: str) -> list[dict]:
    """The entries whose environment marker holds on platform ``key`` under Python ``full_version``."""
    env = environment(key, full_version)
    return [e for e in entries if e["marker"] is None or Marker(e["marker"]).evaluate(env)]


def requirement_lines(entries: list[dict]) -> str:
    return "".join(
        f"{e['name']}=={e['version']} " + " ".join(f"--hash={h}" for h in e["hashes"]) + "\n" for e in entries
    )


def download(entries: list[dict], key: str, full_version: str, dest: Path) -> list[str]:
    """pip downloads the files pinned for platform ``key``; returns the pip command."""
    reqs = dest / "requirements.txt"
    reqs.write_text(requirement_lines(entries))
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", "-d", str(dest)]
    cmd += [
        "--python-version",
        full_version,
        "--implementation",
        "cp",
        "--abi",
        "cp" + "".join(full_version.split(".")[:2]),
    ]
    cmd += [arg for tag in pip_platforms(key) for arg in ("--platform", tag)] + ["-r", str(reqs)]
    subprocess.run(cmd, check=True)
    return cmd


def disk_usage(folder: Path) -> int:
    """Bytes on disk (``du -sk``) of ``folder`` (0 if absent)."""
    if not folder.exists():
        return 0
    return (
        int(subprocess.run(["du", "-sk", str(folder)], check=True, capture_output=True, text=True).stdout.split()[0])
        * 1024
    )


def part(wheel: Path) -> str:
    """Which part of the install a wheel is: ``cuda`` (the GPU runtime), ``torch`` or ``rest``."""
    name = wheel.name.split("-")[0].replace("_", "-").lower()
    return "cuda" if CUDA.match(name) else "torch" if name == "torch" else "rest"


def measure(dest: Path) -> dict:
    """Unpack every downloaded wheel (into one folder per part); sizes of the downloads and unpacked trees."""
    wheels = sorted(dest.glob("*.whl"))
    sdists = sorted(p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip")))
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(dest / "unpacked" / part(wheel))
    unpacked = {name: disk_usage(dest / "unpacked" / name) for name in ("cuda", "torch", "rest")}
    cuda = [w for w in wheels if part(w) == "cuda"]
    return {
        "wheels": len(wheels),
        "sdists": [p.name for p in sdists],
        "download_bytes": sum(p.stat().st_size for p in [*wheels, *sdists]),
        "unpacked_bytes": sum(unpacked.values()),
        "unpacked_bytes_by_part": unpacked,
        "cuda_wheels": len(cuda),
        "cuda_download_bytes": sum(p.stat().st_size for p in cuda),
        "torch_wheel": next((w.name for w in wheels if part(w) == "torch"), None),
    }


def check(key: str, full_version: str, workdir: Path) -> dict:
    entries = for_platform(requirements(LOCK.read_text()), key, full_version)
    workdir.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix=f"lock-{key}-", dir=workdir))
    try:
        cmd = download(entries, key, full_version, dest)
        shown = shlex.join(["python", *cmd[1:]]).replace(str(dest), "DIR")
        return {"pinned": len(entries), **measure(dest), "pip_platforms": pip_platforms(key), "pip_command": shown}
    finally:
        shutil.rmtree(dest)


def pins(key: str, full_version: str) -> str:
    """One line per platform: how many lock entries apply there, and which are the CUDA runtime."""
    entries = for_platform(requirements(LOCK.read_text()), key, full_version)
    cuda = [e["name"] for e in entries if CUDA.match(e["name"])]
    return f"{key} (Python {full_version}): {len(entries)} pinned; CUDA runtime: {', '.join(cuda) or 'none'}"


def provenance() -> dict:
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], check=True, capture_output=True, text=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {
        "pip": pip.stdout.split(" from ")[0],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.system()} {platform.machine()}, {platform.node()}",
        "commit": commit,
        "lock_sha256": hashlib.sha256(LOCK.read_bytes()).hexdigest(),
    }


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def table(results: dict) -> str:
    """The Markdown table of the measured sizes, and the line saying how they were measured."""
    lines = [
        "| platform | torch wheel | packages | download | unpacked | CUDA runtime | torch | the rest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in sorted(results.items()):
        part = r["unpacked_bytes_by_part"]
        row = [key, f"`{r['torch_wheel']}`", str(r["pinned"]), gib(r["download_bytes"]), gib(r["unpacked_bytes"])]
        lines.append("| " + " | ".join([*row, gib(part["cuda"]), gib(part["torch"]), gib(part["rest"])]) + " |")
    r, dates = results[sorted(results)[0]], sorted(r["date"] for r in results.values())
    locks, commits = ({f"`{r[k][:n]}`" for r in results.values()} for k, n in (("lock_sha256", 12), ("commit", 10)))
    lines += [
        "",
        f"Measured {dates[0]} to {dates[-1]} on {r['machine']} ({r['pip']}, markers for Python "
        f"{r['python_full_version']}), requirements.lock sha256 {', '.join(sorted(locks))} "
        f"(checked out: commit {', '.join(sorted(commits))}): "
        f"`python tools/lock_check.py {' '.join(sorted(results))} --out reports/lock/sizes.json`; "
        "the pip command of each platform is in that file.",
    ]
    return "\n".join(lines) + "\n"


def with_table(doc: str, results: dict) -> str:
    """``doc`` with the text between the START and END markers replaced by the sizes table."""
    if START not in doc or END not in doc:
        raise SystemExit(f"error: {DOCS.name}: no sizes table markers ({START} … {END})")
    head, rest = doc.split(START, 1)
    return head + START + "\n" + table(results) + END + rest.split(END, 1)[1]


def main(
    platforms: list[str] = typer.Argument(None, help="linux-x86_64, linux-aarch64 or macos-arm64"),
    docs: bool = typer.Option(False, help=f"rewrite the sizes table of docs/install.md from {SIZES.name}"),
    pins_only: bool = typer.Option(False, help="only print what the lock pins on each platform; no download"),
    out: Path = typer.Option(None, help="merge the results into this JSON file (else print them)"),
    full_version: str = typer.Option(HERE, help="python_full_version in the markers"),
    workdir: Path = typer.Option(Path(tempfile.gettempdir()), help="where the downloads go (deleted after)"),
) -> None:
    if docs:
        DOCS.write_text(with_table(DOCS.read_text(), json.loads(SIZES.read_text())))
        return
    for key in platforms or []:
        environment(key, full_version)  # an unknown platform fails before any download
    if pins_only:
        typer.echo("\n".join(pins(key, full_version) for key in platforms))
        return
    results = json.loads(out.read_text()) if out is not None and out.is_file() else {}
    for key in platforms:
        results[key] = {**check(key, full_version, workdir), "python_full_version": full_version, **provenance()}
        typer.echo(f"{key}: {results[key]['pinned']} pinned, {results[key]['unpacked_bytes'] / 2**30:.2f} GiB unpacked")
    text = json.dumps(results, indent=2, sort_keys=True) + "\n"
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text)


if __name__ == "__main__":
    typer.run(main)
