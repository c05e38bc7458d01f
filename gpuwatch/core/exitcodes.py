"""Every exit status gpuwatch gives, defined once: the CLI's (README, "Commands") and the probe worker's protocol.

The CLI follows sysexits(3) where it has a word for the case — 69 EX_UNAVAILABLE, 78 EX_CONFIG — because systemd
and the shells around a fleet read them: `RestartPreventExitStatus=78` in systemd/gpuwatch.service stops a restart
loop on a config no restart can fix. 2 is argparse's own for bad usage; 141 is what a shell reports for a pipeline
member killed by SIGPIPE. The worker's codes are a private protocol between the probe runner and its child.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_NOT_OK = 1  # the command ran and found something wrong (probe: a GPU did not probe ok; health: one needs action)
EXIT_USAGE = 2  # bad usage (argparse exits with it too)
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a resource the command cannot work without (port taken, no GPU to probe)
EXIT_CONFIG = 78  # EX_CONFIG: invalid configuration; the message names the file (or flag), the key and the problem
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the output's reader left early (`gpuwatch snapshot | head`)

# What each status means, for `gpuwatch --help` and the docs' test (tests/test_docs.py keeps the README in step).
MEANINGS: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_NOT_OK: "found something wrong (gpuwatch probe: a GPU did not probe ok; gpuwatch health: a GPU needs action)",
    EXIT_USAGE: "bad usage",
    EXIT_UNAVAILABLE: "a resource the command cannot work without is unavailable",
    EXIT_CONFIG: "invalid configuration",
    EXIT_BROKEN_PIPE: "the output's reader left early",
}

# The probe worker's exit statuses (gpuwatch/probe/worker.py), read by the probe runner.
WORKER_OK = 0
WORKER_FAILED = 1
WORKER_NO_ENGINE = 3  # no array library can run here: the runner counts skipped_unsupported, never failed

# `gpuwatch health --npd`: node-problem-detector's custom plugin contract, which NPD reads instead of the statuses above
# (its pkg/custompluginmonitor/types/types.go: OK 0, NonOK 1, Unknown 2; plugin/plugin.go maps every other status to
# Unknown too). docs/kubernetes.md.
NPD_OK = 0
NPD_NON_OK = 1
NPD_UNKNOWN = 2
# NPD cuts a plugin's stdout at max_output_length bytes, 80 unless its config says otherwise (types/config.go:32; the
# cut: plugin/plugin.go:335-338): --npd's one line fits it whole.
NPD_MAX_OUTPUT_LENGTH = 80
