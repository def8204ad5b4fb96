#!/usr/bin/env python3
"""
test_av2_convert.py — tools/av2_to_qcshard on the real AV2 sample scenario, checked through
`qctrain inspect --json` against QCNET.md §8.1 (exact edge counts at the official radii).

usage: test_av2_convert.py QCTRAIN_BINARY SOURCE_DIR DATA_DIR (tests/data)

Tracks are read from the parquet file when pyarrow is installed (and then also from the JSON-lines
rendering, which must give the same bytes); without pyarrow only the JSON-lines path runs, and
under CI (CI=true, as .ci/run exports) a missing pyarrow is a failure: CI must not pass with the
parquet path never run (tools/install-deps installs it). Also
checks resume (a second run is "up to date") and that a malformed scenario is named in the error
while the good one is still converted.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

QCTRAIN, SRC, DATA = sys.argv[1], sys.argv[2], sys.argv[3]
TOOL = os.path.join(SRC, 'tools', 'av2_to_qcshard')
SAMPLE = os.path.join(DATA, 'av2-sample')
SCEN = os.path.join(SAMPLE, 'forecasting_scenarios')
JSONL = os.path.join(SAMPLE, 'derived')
SID = '0a1e6f0a-1817-4a98-b02e-db8c9327d151'
EXPECT = {'pt2pl': 1479, 'pl2pl': 6252, 't': 8913, 'pl2a': 24531, 'a2a': 10356, 't2m': 3402,
          'pl2m': 10212, 'a2m': 3432, 'm2m': 900}
failures = []


def check(cond, msg):
    print(('ok    ' if cond else 'FAIL  ') + msg)
    if not cond:
        failures.append(msg)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def inspect(path):
    r = run([QCTRAIN, 'inspect', '--json', path])
    if r.returncode != 0:
        raise SystemExit('qctrain inspect failed (%d): %s' % (r.returncode, r.stderr))
    return json.loads(r.stdout)


def main():
    try:
        import pyarrow  # noqa: F401
        have_pa = True
    except ImportError:
        have_pa = False
        if os.environ.get('CI') in ('true', '1'):
            check(False, 'pyarrow is not installed under CI=true: the parquet path would go '
                  'untested (hint: tools/install-deps installs it, and fails saying why when it '
                  'cannot)')
        else:
            print('note: pyarrow not installed (pip install pyarrow): checking the JSON-lines '
                  'path only')
    tmp = tempfile.mkdtemp(prefix='qc_av2_')
    try:
        out_j = os.path.join(tmp, 'jsonl.qcshard')
        r = run([sys.executable, TOOL, '--quiet', '--out', out_j, '--jsonl-root', JSONL, SCEN])
        check(r.returncode == 0, 'convert (JSON-lines tracks): rc %d %s' % (r.returncode, r.stderr))
        main_out = out_j
        if have_pa:
            out_p = os.path.join(tmp, 'parquet.qcshard')
            r = run([sys.executable, TOOL, '--quiet', '--jobs', '2', '--out', out_p, SCEN])
            check(r.returncode == 0, 'convert (parquet tracks): rc %d %s' % (r.returncode, r.stderr))
            with open(out_p, 'rb') as a, open(out_j, 'rb') as b:
                check(a.read() == b.read(), 'parquet and JSON-lines inputs give identical bytes')
            main_out = out_p
        j = inspect(main_out)
        f = j['files'][0]
        check(f['summary']['scenes'] == 1, 'one scene')
        s = f['scenes'][0]
        check(s['scenario_id'] == SID, 'scenario id %s' % s['scenario_id'])
        check(s['agents'] == 38, 'agents seen in history: %d (expect 38)' % s['agents'])
        check(s['predicted_agents'] == 25, 'predicted agents: %d (expect 25)' % s['predicted_agents'])
        check(s['polygons'] == 83, 'polygons: %d (expect 83 = 71 + 2*6)' % s['polygons'])
        check(s['points'] == 1479, 'points: %d (expect 1479)' % s['points'])
        for k, v in EXPECT.items():
            check(s['edges'][k] == v, 'edges %-5s %6d (QCNET.md 8.1: %d)' % (k, s['edges'][k], v))
        p = j['params']
        check((p['pl2pl_radius'], p['pl2a_radius'], p['a2a_radius'], p['pl2m_radius'],
               p['a2m_radius']) == (150, 50, 50, 150, 150), 'official radii')

        # resume: nothing to do the second time, file untouched
        before = os.stat(out_j).st_mtime_ns
        r = run([sys.executable, TOOL, '--out', out_j, '--jsonl-root', JSONL, SCEN])
        check(r.returncode == 0 and 'up to date' in r.stdout, 'second run is up to date: %s'
              % r.stdout.strip())
        check(os.stat(out_j).st_mtime_ns == before, 'file not rewritten')

        # a malformed scenario is named, the good one still converted
        root = os.path.join(tmp, 'mixed')
        os.makedirs(root)
        shutil.copytree(os.path.join(SCEN, SID), os.path.join(root, SID))
        shutil.copytree(os.path.join(JSONL, SID), os.path.join(tmp, 'jl', SID))
        bad = 'ffffffff-0000-0000-0000-000000000bad'
        os.makedirs(os.path.join(root, bad))
        with open(os.path.join(root, bad, 'log_map_archive_%s.json' % bad), 'w') as fh:
            fh.write('{"lane_segments": {')  # truncated JSON
        os.makedirs(os.path.join(tmp, 'jl', bad))
        with open(os.path.join(tmp, 'jl', bad, 'scenario_%s.jsonl' % bad), 'w') as fh:
            fh.write('{"track_id": "AV"}\n')
        out_m = os.path.join(tmp, 'mixed.qcshard')
        r = run([sys.executable, TOOL, '--quiet', '--jobs', '2', '--out', out_m, '--jsonl-root',
                 os.path.join(tmp, 'jl'), root])
        check(r.returncode == 1, 'malformed scenario -> exit 1 (got %d)' % r.returncode)
        check(bad in r.stderr, 'error names the malformed scenario: %s' % r.stderr.strip()[-300:])
        jm = inspect(out_m)
        check(jm['files'][0]['summary']['scenes'] == 1 and
              jm['files'][0]['scenes'][0]['scenario_id'] == SID, 'the good scenario is converted')
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print('%d failed' % len(failures))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
