"""runner.config: the per-host API keys of remote models (POLLAMA_REMOTE_API_KEYS) as tables:
the syntax, which key an upstream's host and port get, and the malformed values that stop the
CLI with one line that never holds a key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner import config
from runner.config import ConfigError, HostKey, parse_remote_api_keys
from serverproc import ROOT

PARSED = [
    # (value, entries as (host, port, key))
    ("", []),
    (" , ,", []),
    ("gpu-box:8000=sk-abc,api.example.com=sk-def",
     [("gpu-box", 8000, "sk-abc"), ("api.example.com", None, "sk-def")]),
    (" GPU-Box:8000 = sk-abc , ", [("gpu-box", 8000, "sk-abc")]),  # trimmed; hosts lowercase
    ("gpu-box=c2stYWJj==", [("gpu-box", None, "c2stYWJj==")]),  # the key is all after the first '='
    ("10.0.0.7:8000=a,10.0.0.7=b", [("10.0.0.7", 8000, "a"), ("10.0.0.7", None, "b")]),
    ("[::1]:8000=a,[0:0::1]=b,::1:1=c", [("::1", 8000, "a"), ("::1", None, "b"), ("::1:1", None, "c")]),
    ("api.example.com.:443=k", [("api.example.com", 443, "k")]),  # the root's dot dropped
    ("bücher.example=k", [("xn--bcher-kva.example", None, "k")]),  # IDNA, as FROM URLs are kept
]


@pytest.mark.parametrize("raw,want", PARSED)
def test_entries_parse(raw, want):
    assert [(e.host, e.port, e.key) for e in parse_remote_api_keys(raw)] == want


MALFORMED = [
    # (value, what the message says)
    ("sk-only-a-key", "entry 1 has no '='"),
    ("a=1,sk-only-a-key", "entry 2 has no '='"),
    ("=sk-abc", "entry 1 names no host"),
    ("https://api.example.com=sk-abc", "no scheme or path"),
    ("gpu-box/v1=sk-abc", "no scheme or path"),
    ("gpu-box:0=sk-abc", "no port 1-65535"),
    ("gpu-box:65536=sk-abc", "no port 1-65535"),
    ("gpu-box:=sk-abc", "no port 1-65535"),
    ("gpu-box:http=sk-abc", "no port 1-65535"),
    ("[::1=sk-abc", "is not HOST[:PORT]"),
    ("gpu_box=sk-abc", "is not HOST[:PORT]"),
    ("gpu box=sk-abc", "is not HOST[:PORT]"),
    ("a..b=sk-abc", "is not HOST[:PORT]"),
    ("gpu-box=", "entry 1 (gpu-box) has an empty key"),
    ("gpu-box=sk abc", "a space or a character other than visible ASCII"),
    ("gpu-box=sk-äbc", "a space or a character other than visible ASCII"),
    ("gpu-box:8000=sk-abc,GPU-BOX:8000=sk-abc", "entry 2 (GPU-BOX:8000) names the host and port of an earlier"),
    ("[::1]=a,[0::1]=b", "entry 2 ([0::1]) names the host and port of an earlier"),
]


@pytest.mark.parametrize("raw,why", MALFORMED)
def test_malformed_entries_are_one_error_without_the_key(raw, why):
    with pytest.raises(ConfigError) as err:
        config.load({"POLLAMA_REMOTE_API_KEYS": raw})
    message = str(err.value)
    assert message.startswith("POLLAMA_REMOTE_API_KEYS") and why in message and "\n" not in message
    assert "sk-abc" not in message and "sk-only" not in message and "äbc" not in message


def test_the_global_key_must_fit_a_header():
    with pytest.raises(ConfigError, match="^POLLAMA_REMOTE_API_KEY: the key holds a space") as err:
        config.load({"POLLAMA_REMOTE_API_KEY": "sk-abc def"})
    assert "sk-abc" not in str(err.value)


def key_for(env: dict[str, str], host: str, port: int) -> tuple[str, str] | None:
    found = config.load(env).remote_key(host, port)
    return None if found is None else (found.value, found.source)


KEYS = {"POLLAMA_REMOTE_API_KEY": "global",
        "POLLAMA_REMOTE_API_KEYS": "gpu-box:8000=box8000,gpu-box=box,api.example.com:443=api,[::1]:9000=v6"}
CHOSEN = [
    # (host as in the URL, port (the URL's or its scheme's default), key, where it came from)
    ("gpu-box", 8000, "box8000", "POLLAMA_REMOTE_API_KEYS entry gpu-box:8000"),
    ("GPU-BOX", 8000, "box8000", "POLLAMA_REMOTE_API_KEYS entry gpu-box:8000"),  # any case
    ("gpu-box", 8001, "box", "POLLAMA_REMOTE_API_KEYS entry gpu-box"),  # host alone: any other port
    ("gpu-box", 80, "box", "POLLAMA_REMOTE_API_KEYS entry gpu-box"),
    ("api.example.com", 443, "api", "POLLAMA_REMOTE_API_KEYS entry api.example.com:443"),  # https://api.example.com
    ("api.example.com", 80, "global", "POLLAMA_REMOTE_API_KEY"),  # http://api.example.com: another port
    ("api.example.com", 8443, "global", "POLLAMA_REMOTE_API_KEY"),
    ("::1", 9000, "v6", "POLLAMA_REMOTE_API_KEYS entry [::1]:9000"),
    ("0:0::1", 9000, "v6", "POLLAMA_REMOTE_API_KEYS entry [::1]:9000"),
    ("other-box", 8000, "global", "POLLAMA_REMOTE_API_KEY"),
    ("gpu-box.example", 8000, "global", "POLLAMA_REMOTE_API_KEY"),  # no suffix matching
]


@pytest.mark.parametrize("host,port,key,source", CHOSEN)
def test_the_most_specific_key_wins(host, port, key, source):
    assert key_for(KEYS, host, port) == (key, source)


def test_no_key_is_none_and_per_host_keys_need_no_global_one():
    assert key_for({}, "gpu-box", 8000) is None
    only = {"POLLAMA_REMOTE_API_KEYS": "gpu-box=box"}
    assert key_for(only, "gpu-box", 8000) == ("box", "POLLAMA_REMOTE_API_KEYS entry gpu-box")
    assert key_for(only, "other-box", 8000) is None


def test_keys_stay_out_of_reprs():
    cfg = config.load(KEYS)
    assert "box8000" not in repr(cfg) and "global" not in repr(cfg)
    assert "box8000" not in repr(cfg.remote_api_keys) and str(cfg.remote_api_keys[0]) == "gpu-box:8000"
    assert "box8000" not in repr(cfg.remote_key("gpu-box", 8000))
    assert str(HostKey("::1", None, "k")) == "[::1]"


@pytest.mark.parametrize("command", [["run", "rem", "hi"], ["serve"], ["list"]])
def test_the_cli_stops_on_a_malformed_value_with_one_line(tmp_path, command):
    env = {"HOME": str(tmp_path), "OLLAMA_MODELS": str(tmp_path / "models"), "PYTHONPATH": str(ROOT),
           "PATH": "/usr/bin:/bin", "POLLAMA_REMOTE_API_KEYS": "gpu-box:8000=sk-abc,sk-secret-pasted-alone"}
    ran = subprocess.run([sys.executable, "-c", "from cli.main import main; main()", *command], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr.strip() == ("Error: POLLAMA_REMOTE_API_KEYS: entry 2 has no '=': use HOST[:PORT]=KEY, "
                                  "comma-separated")
