#!/usr/bin/env python3
"""`cmake --install` into a prefix of its own (README, "Install"; issue 30): bin/qctrain, the
presets under share/qctrain/profiles/ and tools/av2_submission under share/qctrain/tools/, and
the installed binary finds what it installed beside itself whatever the prefix (the configured
CMAKE_INSTALL_PREFIX is /usr/local: a binary that looked only there would not find a preset that
exists only in this prefix).

usage: test_install.py BUILD_DIR WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok   " + msg)


def main():
    if len(sys.argv) != 3:
        fail(__doc__)
    build, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prefix = os.path.join(work, "prefix")
    r = subprocess.run(["cmake", "--install", build, "--prefix", prefix],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    check(r.returncode == 0, "cmake --install --prefix %s: exit %d\n%s" %
          (prefix, r.returncode, r.stdout.decode(errors="replace")[-2000:]))
    qc = os.path.join(prefix, "bin", "qctrain")
    share = os.path.join(prefix, "share", "qctrain")
    check(os.access(qc, os.X_OK), "bin/qctrain installed, executable")
    check(os.path.exists(os.path.join(share, "profiles", "cpu-smoke.json")),
          "the presets installed under share/qctrain/profiles")
    check(os.access(os.path.join(share, "tools", "av2_submission"), os.X_OK),
          "tools/av2_submission installed under share/qctrain/tools")
    # a preset only the installed folder has, found by name from another working directory,
    # with no QC_PROFILES_DIR
    with open(os.path.join(share, "profiles", "zz-installed-only.json"), "w") as f:
        json.dump({"description": "test_install", "inherits": "cpu-smoke", "train.lr": 0.00123},
                  f)
    env = {k: v for k, v in os.environ.items() if k != "QC_PROFILES_DIR"}
    r = subprocess.run([qc, "--preset", "zz-installed-only", "--config-dump"], cwd=work, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = r.stdout.decode(errors="replace")
    check(r.returncode == 0, "the installed qctrain finds a preset of its prefix by name: exit "
          "%d\n%s" % (r.returncode, out[-1500:]))
    cfg = json.loads(out)
    lr = cfg.get("train", {}).get("lr") if isinstance(cfg.get("train"), dict) else \
        cfg.get("train.lr")
    check(lr is not None and abs(float(lr) - 0.00123) < 1e-12,
          "its keys applied (train.lr %s)" % lr)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
