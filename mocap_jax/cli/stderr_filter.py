"""XLA's false alarms about cached programs, dropped from the command line's stderr.

When it loads a program from the persistent compilation cache (``mocap_jax.api.compile_cache``),
XLA:CPU checks that the host has every CPU feature the program was compiled for.  On hosts where
LLVM tunes code generation with ``+prefer-no-gather`` / ``+prefer-no-scatter`` (many AVX-512 CPUs,
Intel and AMD), the check takes those two tuning preferences for missing CPU features and logs two
error lines of about 2 KB for every program, although the program is the one this host compiled
and it loads and runs correctly (jax-ml/jax#38445).  A command loads tens to hundreds of programs,
so its output drowned in them.

:func:`install` routes the process's standard error (file descriptor 2, which XLA's C++ log writes
to) through a child process running this file, which drops exactly those lines -- the same message
naming any other feature still shows -- and passes everything else through as it arrives (partial
lines too, so progress bars keep moving; a false alarm written after a bar's unfinished line is
dropped from it).  A separate process rather than a thread: if this
process dies, the child still receives everything written before and writes it out.  It ignores
terminal signals (its own session), so Ctrl-C reaches only the command.

Because the child writes what it is given a moment later, a progress bar's last redraw (a carriage
return and the bar's text) could land on the terminal after the command's next line on standard
output and overwrite it.  :func:`sync` waits until the child has written everything sent before it:
it sends :data:`SYNC`, which the child drops and answers on a pipe of its own.

Run directly, this file is the child: standard input to standard error, filtered.  It imports
only the standard library.
"""

from __future__ import annotations

import os
import re
import select
import sys

#: the false alarm: a C++ log line (``E``, date, time, thread) from ``cpu_aot_loader.cc`` about one of
#: the two tuning preferences
NOISE = re.compile(rb"E\d{4} [0-9:.]+ +\d+ cpu_aot_loader\.cc:\d+\] Loading XLA:CPU AOT result\. "
                   rb"Target machine feature \+prefer-no-(?:gather|scatter) is not ")
#: the start of a log line that may still become a false alarm (anchored at the end of the text seen so
#: far): ``E``, its date, time and thread, then anything up to the line's end
MAYBE_NOISE = re.compile(rb"E(?:\d{0,4}|\d{4} [0-9:. ]*|\d{4} [0-9:.]+ +\d+ [^\r\n]*)\Z")
#: an unfinished line that may become a false alarm is held back until its end, up to this many bytes
HOLD_BYTES = 1 << 16
#: where a line ends: a newline, or a carriage return (a progress bar redraws its line after one)
LINE_END = re.compile(rb"[\r\n]")
#: sent by :func:`sync`: the child writes everything before it, drops it and answers (text never holds NUL)
SYNC = b"\x00mocap-jax:sync\x00"
#: the read end of the child's answers, while the filter is installed
_answers: int | None = None


class LineFilter:
    """Drops :data:`NOISE` lines from a byte stream fed in arbitrary pieces.

    A false alarm usually starts a line, but it may also follow a progress bar's unfinished text
    (a bar draws ``\r`` and its text, and XLA's log writes after it): it is dropped there too, and
    the bar's text kept.  Everything that cannot be the start of one goes out at once, so a bar
    keeps moving.
    """

    def __init__(self):
        self.pending = b""         # the unfinished end of a line that may become a false alarm

    def feed(self, data: bytes) -> bytes:
        """What to write now of ``data`` (and of what was held back before it)."""
        data = self.pending + data
        out, start = [], 0
        while (end := LINE_END.search(data, start)) is not None:
            line = data[start:end.end()]
            noise = NOISE.search(line)
            out.append(line if noise is None else line[:noise.start()])
            start = end.end()
        tail = data[start:]
        held = len(tail)
        at = tail.find(b"E")
        while at >= 0:
            if len(tail) - at < HOLD_BYTES and MAYBE_NOISE.match(tail, at):
                held = at
                break
            at = tail.find(b"E", at + 1)
        out.append(tail[:held])
        self.pending = tail[held:]
        return b"".join(out)

    def close(self) -> bytes:
        """What is left at the end of the stream."""
        rest, self.pending = self.pending, b""
        return b"" if NOISE.match(rest) else rest


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _partial_sync(data: bytes) -> int:
    """The length of the longest end of ``data`` that may be the start of a :data:`SYNC` cut short."""
    for n in range(min(len(data), len(SYNC) - 1), 0, -1):
        if SYNC.startswith(data[-n:]):
            return n
    return 0


def pump(source: int = 0, sink: int = 2, answers: int | None = None) -> None:
    """Copy ``source`` to ``sink`` through a :class:`LineFilter` until the end of ``source``; at each
    :data:`SYNC`, once everything before it is written, write one byte to ``answers``."""
    lines, carry = LineFilter(), b""
    while chunk := os.read(source, 1 << 16):
        *done, rest = (carry + chunk).split(SYNC)
        for part in done:
            _write_all(sink, lines.feed(part))
            if answers is not None:
                _write_all(answers, b"1")
        keep = _partial_sync(rest)
        carry = rest[len(rest) - keep:] if keep else b""
        _write_all(sink, lines.feed(rest[:len(rest) - keep]))
    _write_all(sink, lines.feed(carry) + lines.close())


def sync(timeout_s: float = 2.0) -> None:
    """Wait (at most ``timeout_s``) until the filter has written all that this process sent to its
    standard error; nothing to do where the filter is not installed."""
    if _answers is None:
        return
    try:
        sys.stderr.flush()
        os.write(2, SYNC)
        if select.select([_answers], [], [], timeout_s)[0]:
            os.read(_answers, 1)
    except (OSError, ValueError):
        pass


def install() -> bool:
    """Route this process's file descriptor 2 through the filter until the process exits (POSIX;
    only where ``sys.stderr`` is the process's own, e.g. not under a test runner's capture).
    Returns whether it did."""
    import atexit
    import subprocess

    if os.name != "posix" or sys.stderr is not sys.__stderr__ or os.environ.get("MOCAP_JAX_RAW_STDERR"):
        return False
    global _answers
    try:
        sys.stderr.flush()
        answers, answer_end = os.pipe()
        child = subprocess.Popen([sys.executable, "-S", os.path.abspath(__file__), str(answer_end)],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
                                 pass_fds=(answer_end,))
    except OSError:
        return False
    os.close(answer_end)
    _answers = answers
    saved = os.dup(2)
    os.dup2(child.stdin.fileno(), 2)

    def restore() -> None:
        global _answers
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)
        os.close(answers)
        _answers = None
        child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    atexit.register(restore)
    return True


if __name__ == "__main__":
    pump(answers=int(sys.argv[1]) if len(sys.argv) > 1 else None)
