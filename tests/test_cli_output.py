"""The command line's output and report path (issue 29, item 14): output piped
into ``head`` ends quietly and the report is still written; the report path is
checked before anything is measured, and errors name the user's path; --version;
no Python dict in titles."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import compiled_autograd as ca
from compiled_autograd.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--example", "mlp", "--layers", "1", "--width", "8", "--batch", "4"]


def _cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "compiled_autograd", *args], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), **kwargs)


@pytest.mark.parametrize("command", [["trace"], ["memory", "--report", "{tmp}/r.html"]])
def test_output_piped_into_head_ends_quietly_and_the_report_is_written(command, tmp_path):
    command = [c.replace("{tmp}", str(tmp_path)) for c in command]
    proc = subprocess.Popen([sys.executable, "-m", "compiled_autograd", *command, *SMALL],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()                 # `| head -1`: one line, then the pipe closes
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, stderr
    assert "BrokenPipeError" not in stderr and "Traceback" not in stderr, stderr
    if "memory" in command:
        assert (tmp_path / "r.html").stat().st_size > 0


def test_version():
    done = _cli("--version", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("compiled-autograd "), done
    assert main(["--version"], out=lambda s: None) == 0


@pytest.mark.parametrize("path, message", [
    ("", "--report needs a file name"),
    ("/proc/r.html", "cannot write the report '/proc/r.html'"),
    ("/nonexistent/x.html", "the directory '/nonexistent' does not exist"),
])
def test_a_bad_report_path_is_refused_before_measuring(path, message, capsys, monkeypatch):
    import compiled_autograd.cli as cli
    monkeypatch.setattr(cli, "load_model", lambda args: pytest.fail("measured first"))
    assert main(["memory", *SMALL, "--report", path], out=lambda s: None) == 2
    err = capsys.readouterr().err
    assert message in err and ".tmp" not in err, err


def test_a_report_that_cannot_be_written_names_the_users_path():
    x = ca.randn(3, requires_grad=True)
    with ca.memory.profile() as prof:
        (x * x).sum().backward()
    with pytest.raises(FileNotFoundError) as info:
        prof.report("/nonexistent/x.html")
    assert info.value.filename == "/nonexistent/x.html" and ".tmp" not in str(info.value)


def test_titles_show_the_sizes_without_a_python_dict(tmp_path):
    lines = []
    assert main(["memory", *SMALL, "--report", str(tmp_path / "r.html")],
                out=lines.append) == 0
    assert lines[0] == "model: mlp (layers=1, width=8, batch=4)"
    html = (tmp_path / "r.html").read_text()
    assert "mlp (layers=1, width=8, batch=4)" in html and "{&#39;" not in html


def test_the_reports_bytes_glossary_and_budget_come_from_the_run(tmp_path):
    from compiled_autograd.memory.chart import format_bytes
    assert format_bytes(31.04 * 1024) == "31.04 KiB"       # as the command line's rows
    path = tmp_path / "plan.html"
    lines = []
    assert main(["memory", "--example", "transformer", "--layers", "1", "--d-model", "16",
                 "--heads", "2", "--seq", "8", "--batch", "2", "--vocab", "20",
                 "--budget", "0.9", "--report", str(path)], out=lines.append) == 0
    html = path.read_text()
    peak_at = html[html.index("after "):].split(" kernel calls")[0]    # the peak's row
    assert f"&#34;{peak_at} kernel calls&#34; (this run" in html or \
        f'"{peak_at} kernel calls" (this run' in html
    assert "after 473 kernel calls" not in html or peak_at == "after 473"
    assert ">budget " in html and 'stroke-dasharray="5 3"' in html
