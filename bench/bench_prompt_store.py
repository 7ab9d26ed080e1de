"""The prompt store (issue 25): conversations taking turns on one slot, both engines, both tiers,
and llama.cpp's `llama-server --cache-ram` side by side.

    python bench/bench_prompt_store.py [--convs 4,16] [--tokens 2000] [--tokens-most N]
        [--sizes 2048,4096,8000] [--threads 2] [--engines old,new] [--models smollm2,gemma3]
        [--disk-mib 8192] [--rounds 3] [--skip turns,off,server,restore] [--llama-server PATH]

(a) Per model and per ``--convs`` N: N conversations of ~``--tokens`` tokens take turns on one
slot (raw prompts, greedy, one generated token: TTFT = the request's wall time, in process), on
each engine and on llama-server, all loaded at once and **interleaved turn by turn**
(conversation k's turn on the old engine, the new engine, then llama-server), so a machine that
slows down for a while (this one is 2 shared cores) slows every runner alike. While llama-server
takes a turn, pollama's disk writers hold off as for pollama's own prompts. Each conversation
starts with its own word, so no two share a first token.

- *cold*: each conversation's first turn (the slot holds the previous conversation);
- *RAM*: each one's returning turns, each after all the others had the slot, ``--rounds`` of
  them (``OLLAMA_CACHE_RAM=1024``, ``POLLAMA_CACHE_DISK=8192``, or ``--disk-mib``: the state comes
  back from RAM), each a question more;
- *disk*: the runner closes (its unload writes the slot to disk; the others went there when they
  lost it), the cache files are pushed out of the OS page cache (``fsync`` +
  ``posix_fadvise(DONTNEED)``, this benchmark's own files only), and a new runner on the same
  folder with the RAM tier off takes each conversation's next turn: the state comes from disk;
- *off*: a runner with both tiers off (``OLLAMA_CACHE_RAM=0``, ``POLLAMA_CACHE_DISK=0``) takes
  two turns of each of the first ``--off`` conversations, at the first ``--convs`` only: the
  second turn re-evaluates everything whatever N is.

Every turn's ``prompt_cache_source`` is checked ("ram", "disk"; cold and off turns reuse at most
16 tokens), so a row cannot claim a tier that did not serve it. Medians over the conversations
(and rounds).
A sampler thread per engine (every 50 ms) records its RAM tier's bytes and cache folder's bytes
(temporary files included) against their bounds, and the process's RSS: both engines live in the
one benchmark process, so the pollama rows' RSS columns are that process's (both engines).

llama-server: ``llama-server -np 1 --cache-ram 8192`` built from the llama-cpp-python sdist
(:func:`bench_decode.llama_cpp_tool`), same model, context, threads, batch (512), f16 KV and
flash attention off; the same conversations over HTTP (``/completion``, ``cache_prompt``,
``n_predict`` 1): wall time, and its ``timings.cache_n`` to check what it reused. Its restart
row restarts the server and sends two conversations' next turns (its cache is RAM only).

(b) Restore vs recompute of one sequence of ``--sizes`` tokens per engine and model on the engine
itself: evaluating the tokens (512 a batch) against ``export_seq`` + ``import_seq``, and the disk
tier's write and (page cache dropped) checked read of a state that size
(:class:`runner.kvstore.disk.DiskStore`), as the store does them: cut into pages of 16 tokens, a
file each, read back and joined (a sliding window's state: whole, one file).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options, Request  # noqa: E402
from runner.kvstore.disk import DiskStore  # noqa: E402
from runner.kvstore.key import BLOCK, DIGEST, chain  # noqa: E402

import bench_decode  # noqa: E402

WORDS = ("harbor lantern river stone orchard winter market letter engine garden silver morning "
         "thunder valley bridge candle meadow paper window forest copper island harvest signal").split()
FOLLOW = "\nQuestion: which word came up most often, and why might that be?\nAnswer:"
FOLLOW2 = " The harbor, because the story is about the sea.\nQuestion: and which word came last?\nAnswer:"
RAM_MIB, DISK_MIB, SERVER_RAM_MIB = 1024, 8192, 8192
BENCH_CACHE = bench_decode.CACHE


def text(seed: int, tokens: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(int(tokens * 1.15)))  # a word is ~1 token; (b) cuts


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# ------------------------------------------------------------------------------------ models
def models(names: list[str]) -> dict[str, tuple[str, str | None]]:
    """name -> (label, what runner.resolve takes: None for the default model, else a path)."""
    out: dict[str, tuple[str, str | None]] = {}
    for name in names:
        if name == "smollm2":
            out[name] = ("SmolLM2-135M Q4_1", None)
        elif name == "gemma3":
            out[name] = ("gemma-3-270m Q4_K_M", str(bench_decode.gemma3()))
        else:
            raise SystemExit(f"unknown model {name!r}")
    return out


def cfg_for(engine: str, ram: int, disk: int, folder: Path) -> config.Config:
    return dataclasses.replace(config.load({}), new_engine=engine == "new", cache_ram=ram, cache_disk=disk,
                               cache_dir=folder)


# ----------------------------------------------------------------------------------- sampler
def rss_bytes(pid: int | str = "self") -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def folder_bytes(folder: Path | None) -> int:
    if folder is None:
        return 0
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
    return total


class Sampler:
    """Peaks of a process's RSS and the RAM tier's bytes every 50 ms, and of a cache folder's
    bytes every 250 ms (and at the start and end): listing ~600 files holds the GIL a few
    milliseconds, which the in-process runner's loop would pay every 50 ms."""

    def __init__(self, pid: int | str = "self", tiers=None, folder: Path | None = None) -> None:
        self.pid, self.tiers, self.folder = pid, tiers, folder
        self.rss = self.ram = self.disk = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self, folder: bool = True) -> None:
        self.rss = max(self.rss, rss_bytes(self.pid))
        if self.tiers is not None:
            self.ram = max(self.ram, self.tiers.ram.used)
        if folder:
            self.disk = max(self.disk, folder_bytes(self.folder))

    def _run(self) -> None:
        k = 0
        while not self._stop.wait(0.05):
            k += 1
            self.sample(folder=k % 5 == 0)

    def __enter__(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def drop_page_cache(folder: Path) -> int:
    """Write this benchmark's cache files out and drop them from the OS page cache (only these
    files: the next read goes to the disk). Returns how many."""
    n = 0
    for path in folder.glob("*.kv"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


# -------------------------------------------------------------------------------- pollama turns
@dataclasses.dataclass
class Turn:
    ms: float
    evaluated: int
    cached: int
    source: str


def turn(r, prompt: str) -> Turn:
    """One greedy one-token request: its wall time and what the prompt cache gave."""
    request = Request(prompt=prompt, raw=True, options=Options().merged({"temperature": 0, "num_predict": 1}))
    t0 = time.perf_counter()
    final = None
    for chunk in r.stream(request):
        if chunk.done:
            final = chunk
    ms = (time.perf_counter() - t0) * 1e3
    m = final.metrics
    return Turn(ms, m.prompt_eval_count, m.prompt_cached_count, m.prompt_cache_source)


def expect(turns: list[Turn], source: str, what: str) -> None:
    """Fail the run when a turn was not served as its row says."""
    for k, t in enumerate(turns):
        if source:
            ok = t.source == source and t.evaluated < t.cached
        else:  # a stored state may share a word or two with a cold prompt, and be restored for it
            ok = t.cached <= 16
        if not ok:
            raise SystemExit(f"{what}, conversation {k}: expected {source or 'no stored state'}, got {t}")


@dataclasses.dataclass
class Row:
    engine: str
    n: int
    cold: list[Turn]
    ram: list[Turn]
    disk: list[Turn]
    off: list[Turn]
    rss_base: int  # after the first turn, before anything was stored
    rss_peak: int
    ram_peak: int
    disk_peak: int
    files: int  # cache files pushed out of the page cache before the restart


def load_runner(model: str | None, engine: str, ram: int, disk: int, folder: Path, num_ctx: int, threads: int):
    cfg = cfg_for(engine, ram, disk, folder)
    r = runner.load(runner.resolve(model, cfg), Options().merged({"num_ctx": num_ctx, "num_thread": threads}),
                    cfg, num_parallel=1)
    if r.engine != engine:
        raise SystemExit(f"asked for the {engine} engine, got {r.engine}")
    return r, runner.prompt_tiers(cfg)


def side_by_side(model: str | None, engines: list[str], docs: list[str], num_ctx: int, threads: int, off: int,
                 work: Path, disk_mib: int, binary: Path | None, model_path: str,
                 restarts: int, rounds: int = 1) -> tuple[list[Row], list[ServerRow]]:
    """The cold and RAM turns of every runner interleaved turn by turn (conversation k's turn on
    the old engine, the new engine, then llama-server, all three loaded), so a machine that
    slows down for a while slows every runner's turns alike; then the disk turns (both engines'
    restarted runners, interleaved), llama-server's turns after its restart, and the store-off
    turns (each engine in turn). While llama-server takes a turn, pollama's disk writers hold
    off as they do for pollama's own prompts (:meth:`DiskStore.hold`)."""
    n = len(docs)
    live = {}
    for engine in engines:
        folder = work / f"{engine}-{n}"
        r, tiers = load_runner(model, engine, RAM_MIB, disk_mib, folder, num_ctx, threads)
        live[engine] = (r, folder, Sampler("self", tiers, folder / "kv"))
    srv = llama_server(binary, model_path, num_ctx, threads) if binary is not None else None
    srv_sampler = Sampler(srv.proc.pid) if srv is not None else None
    held = object()  # llama-server's turns, to pollama's disk writers

    def srv_turn(prompt: str) -> ServerTurn:
        DiskStore.hold(held, True)
        try:
            assert srv is not None
            return server_turn(srv, prompt)
        finally:
            DiskStore.hold(held, False)

    cold: dict[str, list[Turn]] = {e: [] for e in engines}
    ram: dict[str, list[Turn]] = {e: [] for e in engines}
    s_cold: list[ServerTurn] = []
    s_ram: list[ServerTurn] = []
    rss_base = srv_base = 0
    with contextlib.ExitStack() as stack:
        for _, _, sampler in live.values():
            stack.enter_context(sampler)
        if srv_sampler is not None:
            stack.enter_context(srv_sampler)
        try:
            for k, d in enumerate(docs):
                for engine in engines:
                    cold[engine].append(turn(live[engine][0], d))
                if srv is not None:
                    s_cold.append(srv_turn(d))
                if k == 0:  # the engines' working sets, nothing stored yet
                    rss_base, srv_base = rss_bytes(), rss_bytes(srv.proc.pid) if srv is not None else 0
            for round_ in range(1, rounds + 1):
                for d in docs:  # each after all the others had the slot
                    for engine in engines:
                        ram[engine].append(turn(live[engine][0], d + FOLLOW * round_))
                    if srv is not None:
                        s_ram.append(srv_turn(d + FOLLOW * round_))
        finally:
            for r, _, _ in live.values():
                r.close()  # the unload writes the slot's conversation to disk
            srv_peak = srv.peak_rss() if srv is not None else 0
            if srv is not None:
                srv.close()
    rows = {}
    for engine in engines:
        expect(cold[engine], "", f"{engine} cold")
        expect(ram[engine], "ram", f"{engine} returning (RAM)")
        _, folder, sampler = live[engine]
        rows[engine] = Row(engine, n, cold[engine], ram[engine], [], [], rss_base, sampler.rss, sampler.ram,
                           sampler.disk, drop_page_cache(folder / "kv"))
    if disk_mib:
        again = {e: load_runner(model, e, 0, disk_mib, live[e][1], num_ctx, threads) for e in engines}
        for e, (_, tiers) in again.items():
            live[e][2].tiers = tiers
        try:
            for d in docs:
                for engine in engines:
                    rows[engine].disk.append(turn(again[engine][0], d + FOLLOW * rounds + FOLLOW2))
        finally:
            for r, _ in again.values():
                r.close()
        for engine in engines:
            expect(rows[engine].disk, "disk", f"{engine} after a restart (disk)")
            sampler = live[engine][2]
            sampler.sample()
            rows[engine].disk_peak = max(rows[engine].disk_peak, sampler.disk)
    for engine in engines:
        if off:
            r, _ = load_runner(model, engine, 0, 0, live[engine][1], num_ctx, threads)
            try:
                for d in docs[:off]:
                    turn(r, d)
                rows[engine].off = [turn(r, d + FOLLOW) for d in docs[:off]]
            finally:
                r.close()
            expect(rows[engine].off, "", f"{engine} returning, store off")
        shutil.rmtree(live[engine][1], ignore_errors=True)
    servers: list[ServerRow] = []
    if srv is not None:
        assert srv_sampler is not None
        for k, t in enumerate(s_ram):
            if t.cache_n <= t.prompt_n:
                raise SystemExit(f"llama-server returning turn {k} reused {t.cache_n} tokens, evaluated {t.prompt_n}")
        restart: list[ServerTurn] = []
        if restarts:
            assert binary is not None
            again_srv = llama_server(binary, model_path, num_ctx, threads)
            try:
                restart = [server_turn(again_srv, d + FOLLOW * rounds + FOLLOW2) for d in docs[:restarts]]
            finally:
                again_srv.close()
        servers.append(ServerRow(n, s_cold, s_ram, restart, srv_base, max(srv_sampler.rss, srv_peak)))
    return [rows[e] for e in engines], servers


# ------------------------------------------------------------------------------- llama-server
@dataclasses.dataclass
class ServerTurn:
    ms: float
    prompt_n: int
    cache_n: int
    prompt_ms: float


def llama_server(binary: Path, model: str, num_ctx: int, threads: int) -> bench_decode.LlamaServer:
    return bench_decode.LlamaServer(binary, [
        "-m", model, "-np", "1", "--cache-ram", str(SERVER_RAM_MIB), "-c", str(num_ctx), "-t", str(threads),
        "-tb", str(threads), "-b", "512", "-ub", "512", "-fa", "off", "-ctk", "f16", "-ctv", "f16"])


def server_turn(srv: bench_decode.LlamaServer, prompt: str) -> ServerTurn:
    """One greedy one-token request: its wall time and what llama-server's cache gave."""
    t0 = time.perf_counter()
    reply = srv.post("/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": True, "temperature": 0,
                                     "stream": False})
    ms = (time.perf_counter() - t0) * 1e3
    t = reply["timings"]
    return ServerTurn(ms, int(t["prompt_n"]), int(t.get("cache_n", 0)), float(t["prompt_ms"]))


@dataclasses.dataclass
class ServerRow:
    n: int
    cold: list[ServerTurn]
    ram: list[ServerTurn]
    restart: list[ServerTurn]
    rss_base: int
    rss_peak: int


# ------------------------------------------------------------------------------------ (b)
@dataclasses.dataclass
class Restore:
    engine: str
    tokens: int
    state: int
    recompute: float
    export: float
    load: float
    write: float
    read: float


def restore(model: str | None, engine: str, sizes: list[int], threads: int, work: Path) -> list[Restore]:
    cfg = cfg_for(engine, 0, 0, work)
    info = runner.resolve(model, cfg).info
    plan = runner.load_options(info, Options().merged({"num_ctx": max(sizes) + 16, "num_batch": 512,
                                                       "num_thread": threads}), cfg, 1)
    if engine == "new":
        from runner.engines.ggml import GGMLEngine as Engine
    else:
        from runner.engines.llamacpp.engine import LlamaEngine as Engine
    eng = Engine(info, plan)
    disk = DiskStore(work / f"restore-{engine}", 64 << 30, BLOCK)
    out = []
    try:
        for n in sizes:
            tokens = eng.tokenize(text(100 + n, n))[:n]
            eng.kv.seq_rm(0, 0, None)
            t0 = time.perf_counter()
            for i in range(0, len(tokens), 512):
                eng.batch_begin()
                eng.batch_add(tokens[i : i + 512], i, 0)
                eng.prepare()
                eng.decode()
            recompute = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            state = eng.kv.export_seq(0)
            export = (time.perf_counter() - t0) * 1e3
            eng.kv.seq_rm(0, 0, None)
            t0 = time.perf_counter()
            assert eng.kv.import_seq(0, state)
            load_ms = (time.perf_counter() - t0) * 1e3
            found = chain(bytes(DIGEST), tokens, BLOCK)
            t0 = time.perf_counter()  # as the store writes it: cut into pages (a sliding window: whole)
            parts = eng.kv.split_state(state, [page.start for page in found.pages()] + [found.n])
            assert disk.write(found, state) if parts is None else disk.write_pages(found, parts)
            write = (time.perf_counter() - t0) * 1e3
            drop_page_cache(disk.layout.inside("kv"))
            hit = disk.lookup(found)
            assert hit is not None and hit.n == len(tokens)
            t0 = time.perf_counter()  # every file read and checked, pages joined into one state
            read_back = disk.read(hit)
            assert read_back is not None
            back = read_back[1][0] if hit.whole else eng.kv.join_states(read_back[1])
            read = (time.perf_counter() - t0) * 1e3
            assert bytes(back) == bytes(state)
            out.append(Restore(engine, len(tokens), len(state), recompute, export, load_ms, write, read))
            del state, back
    finally:
        eng.close()
        shutil.rmtree(work / f"restore-{engine}", ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------ output
def mib(b: int) -> str:
    return f"{b / 2**20:.0f}"


def print_turns(label: str, tokens: int, rows: list[Row], servers: list[ServerRow], disk_mib: int) -> None:
    print(f"\n(a) {label}: N conversations (--tokens {tokens}) taking turns on 1 slot; TTFT medians (ms)\n")
    print("| runner | N | prompt tok | cold | RAM (returning) | RAM / cold | disk (after restart) | disk / cold "
          "| store off (returning) | off / cold |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        c = med([t.ms for t in row.cold])
        ram, disk = med([t.ms for t in row.ram]), med([t.ms for t in row.disk])
        toks = med([t.evaluated + t.cached for t in row.cold])
        off = f"{med([t.ms for t in row.off]):.0f} | {med([t.ms for t in row.off]) / c:.2f}" if row.off else "— | —"
        disk_cells = f"{disk:.1f} | {disk / c:.3f}" if row.disk else "— | —"
        print(f"| pollama, {row.engine} engine | {row.n} | {toks:.0f} | {c:.0f} | {ram:.1f} | {ram / c:.3f} | "
              f"{disk_cells} | {off} |")
    for sv in servers:
        c = med([t.ms for t in sv.cold])
        ram = med([t.ms for t in sv.ram])
        toks = med([t.prompt_n + t.cache_n for t in sv.cold])
        back = med([t.ms for t in sv.restart])
        rs = f"{back:.0f} (n={len(sv.restart)}) | {back / c:.2f}" if sv.restart else "— | —"
        print(f"| llama-server --cache-ram | {sv.n} | {toks:.0f} | {c:.0f} | {ram:.1f} | {ram / c:.3f} | {rs} "
              f"| — | — |")
    print("\nWhat the returning turns evaluated and reused (medians), and memory (peaks, MiB)\n")
    print("| runner | N | RAM turn: evaluated / restored | disk turn: evaluated / restored | off turn evaluated "
          f"| RAM tier (≤ {RAM_MIB}) | cache folder (≤ {disk_mib}) | RSS after turn 1 | RSS peak |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        off = f"{med([t.evaluated for t in row.off]):.0f}" if row.off else "—"
        disk = f"{med([t.evaluated for t in row.disk]):.0f} / {med([t.cached for t in row.disk]):.0f}" \
            if row.disk else "—"
        print(f"| pollama, {row.engine} | {row.n} | {med([t.evaluated for t in row.ram]):.0f} / "
              f"{med([t.cached for t in row.ram]):.0f} | {disk} | {off} | {mib(row.ram_peak)} | {mib(row.disk_peak)} "
              f"({row.files} files) | {mib(row.rss_base)} | {mib(row.rss_peak)} |")
    for sv in servers:
        rs = f"{med([t.prompt_n for t in sv.restart]):.0f} / {med([t.cache_n for t in sv.restart]):.0f}" \
            if sv.restart else "—"
        print(f"| llama-server | {sv.n} | {med([t.prompt_n for t in sv.ram]):.0f} / "
              f"{med([t.cache_n for t in sv.ram]):.0f} | {rs} (restart) | — | (≤ {SERVER_RAM_MIB}) | — "
              f"| {mib(sv.rss_base)} | {mib(sv.rss_peak)} |")
    print("\nThe returning (RAM) turns one by one, in the order taken (ms)\n")
    for row in rows:
        print(f"- pollama, {row.engine}, N={row.n}: " + ", ".join(f"{t.ms:.0f}" for t in row.ram))
    for sv in servers:
        print(f"- llama-server, N={sv.n}: " + ", ".join(f"{t.ms:.0f}" for t in sv.ram))


def print_restore(label: str, rows: list[Restore]) -> None:
    print(f"\n(b) {label}: one sequence, evaluate its tokens vs restore its state (ms)\n")
    print("| engine | tokens | state (MB) | recompute | export | import | recompute / (export + import) "
          "| disk write | disk read (cold) | recompute / (read + import) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.engine} | {r.tokens} | {r.state / 1e6:.1f} | {r.recompute:.0f} | {r.export:.1f} | "
              f"{r.load:.1f} | {r.recompute / (r.export + r.load):.0f}× | {r.write:.1f} | {r.read:.1f} | "
              f"{r.recompute / (r.read + r.load):.0f}× |")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", default="4,16", help="conversation counts, comma-separated")
    ap.add_argument("--tokens", type=int, default=2000, help="~tokens per conversation")
    ap.add_argument("--tokens-most", type=int, default=0, help="~tokens per conversation for the largest --convs "
                    "(default: --tokens)")
    ap.add_argument("--sizes", default="2048,4096,8000")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engines", default="old,new")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--off", type=int, default=4, help="conversations of the store-off runner (first --convs only)")
    ap.add_argument("--server-restarts", type=int, default=2, help="llama-server turns after its restart")
    ap.add_argument("--rounds", type=int, default=3, help="returning turns per conversation (RAM rows)")
    ap.add_argument("--disk-mib", type=int, default=DISK_MIB, help="POLLAMA_CACHE_DISK of the store-on runner; "
                    "0: the RAM tier alone, no restart row")
    ap.add_argument("--skip", default="", help="comma-separated: turns,off,server,restore")
    ap.add_argument("--llama-server", default="", help="a llama-server binary (default: build it)")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    convs = [int(n) for n in args.convs.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    engines = args.engines.split(",")
    chosen = models(args.models.split(","))
    binary = None
    if "server" not in skip and "turns" not in skip:
        binary = Path(args.llama_server) if args.llama_server else bench_decode.llama_cpp_tool("llama-server")
    start = time.perf_counter()
    print(f"machine: {bench_decode.machine()}")
    print(f"threads: {args.threads} (pollama num_thread, llama-server -t/-tb); load average at start: "
          f"{load_average()}; commit: {bench_decode.git_head(HERE.parent)}")
    BENCH_CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="prompt-store-", dir=BENCH_CACHE))
    try:
        for name, (label, model) in chosen.items():
            if "turns" not in skip:
                rows: list[Row] = []
                servers: list[ServerRow] = []
                for i, n in enumerate(convs):
                    tokens = args.tokens_most if args.tokens_most and n == max(convs) else args.tokens
                    # each starts with its own word (its own first token in both vocabularies): a
                    # stored state sharing a word or two with a cold prompt would be restored for it
                    # and leave RAM, and its own return would come from disk (see bench/README.md)
                    docs = [f"{WORDS[k % len(WORDS)]} {text(1000 * n + k, tokens)}" for k in range(n)]
                    num_ctx = tokens * 2 + 512
                    off = 0 if "off" in skip or i > 0 else min(args.off, n)
                    path = runner.resolve(model, config.load({})).info.path
                    found, found_servers = side_by_side(model, engines, docs, num_ctx, args.threads, off, work,
                                                        args.disk_mib, binary, path,
                                                        args.server_restarts if i == 0 else 0, args.rounds)
                    rows += found
                    servers += found_servers
                    print(f"  [{time.perf_counter() - start:.0f} s] {label}, N={n} done; load {load_average()}",
                          file=sys.stderr)
                print_turns(label, args.tokens, rows, servers, args.disk_mib)
            if "restore" not in skip:
                found = []
                for engine in engines:
                    found += restore(model, engine, sizes, args.threads, work)
                print_restore(label, found)
                print(f"  [{time.perf_counter() - start:.0f} s] {label}, restore done", file=sys.stderr)
            sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average at end: {load_average()}; {time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
