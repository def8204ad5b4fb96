"""
av2/convert.py — Argoverse 2 motion-forecasting scenario -> one qcshard record.

Re-implements QCNet's ArgoverseV2Dataset preprocessing (QCNET.md §7; datasets/
argoverse_v2_dataset.py at ZikangZhou/QCNet 55cacb4) in plain Python: agent selection and order,
vector_repr masks, map polygons (lanes + 2 per crosswalk), point groups, typed pl2pl edges. Every
tensor value is computed in float32 the way PyTorch does it (each intermediate rounded to
binary32), and av2's interp_arc / compute_midpoint_line (crosswalk centre lines) are re-created
with numpy's mixed float64/float32 semantics. Transcendentals (atan2) are evaluated in double
and rounded to float32, so they can differ from PyTorch's in the last bit (QCNET.md §10).

Inputs: scenario_<id>.parquet (pyarrow) or its JSON-lines rendering (one object per row, same
columns), and log_map_archive_<id>.json. Output: the record bytes of docs/QCSHARD.md.
"""
import array
import bisect
import glob
import json
import math
import os
import struct

S = 110  # time steps
T_HIST = 50

AGENT_TYPES = ['vehicle', 'pedestrian', 'motorcyclist', 'cyclist', 'bus', 'static', 'background',
               'construction', 'riderless_bicycle', 'unknown']
POLYGON_TYPES = ['VEHICLE', 'BIKE', 'BUS', 'PEDESTRIAN']
POLYGON_IS_INTERSECTIONS = [True, False, None]
POINT_TYPES = ['DASH_SOLID_YELLOW', 'DASH_SOLID_WHITE', 'DASHED_WHITE', 'DASHED_YELLOW',
               'DOUBLE_SOLID_YELLOW', 'DOUBLE_SOLID_WHITE', 'DOUBLE_DASH_YELLOW', 'DOUBLE_DASH_WHITE',
               'SOLID_YELLOW', 'SOLID_WHITE', 'SOLID_DASH_WHITE', 'SOLID_DASH_YELLOW', 'SOLID_BLUE',
               'NONE', 'UNKNOWN', 'CROSSWALK', 'CENTERLINE']
POINT_SIDES = ['LEFT', 'RIGHT', 'CENTER']
PL2PL_TYPES = ['NONE', 'PRED', 'SUCC', 'LEFT', 'RIGHT']

TRACK_COLUMNS = ['track_id', 'object_type', 'object_category', 'timestep', 'position_x',
                 'position_y', 'heading', 'velocity_x', 'velocity_y', 'city']


class ScenarioError(Exception):
    """A malformed scenario; the message names what is wrong."""


# ---- float32 arithmetic ------------------------------------------------------------------------

_F = struct.Struct('<f')


def f32(x):
    """Round a Python float (binary64) to the nearest binary32, as a Python float."""
    try:
        return _F.unpack(_F.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def f32v(xs):
    """Round a sequence to binary32 (bulk)."""
    return list(array.array('f', xs))


def add(a, b):
    return f32(a + b)


def sub(a, b):
    return f32(a - b)


def mul(a, b):
    return f32(a * b)


def atan2_f(y, x):
    return f32(math.atan2(y, x))


def norm2_f(x, y):
    """torch.norm over 2 float32 components: sqrt of a float32 sum of squares."""
    return f32(math.sqrt(add(mul(x, x), mul(y, y))))


def norm3_f(x, y, z):
    return f32(math.sqrt(add(add(mul(x, x), mul(y, y)), mul(z, z))))


def vsub(a, b):
    return tuple(sub(p, q) for p, q in zip(a, b))


def vmid(a, b):
    """(a + b) / 2 elementwise in float32 (the /2 is exact)."""
    return tuple(f32(add(p, q) / 2.0) for p, q in zip(a, b))


# ---- av2 interp_arc / compute_midpoint_line, numpy semantics -------------------------------------

def _np_sum_f32(vals):
    """np.add.reduce of a short float32 vector: first element + a 0-started sequential sum of the
    rest (numpy's pairwise sum below 8 elements)."""
    if not vals:
        return 0.0
    rest = 0.0
    for v in vals[1:]:
        rest = f32(rest + v)
    return f32(vals[0] + rest)


def _linspace01(t):
    if t == 1:
        return [0.0]
    step = 1.0 / (t - 1)
    ys = [k * step for k in range(t)]
    ys[-1] = 1.0
    return ys


def interp_arc(t, points):
    """av2.geometry.interpolate.interp_arc on a float32 (n, 3) polyline; returns float64 points."""
    n = len(points)
    eq = _linspace01(t)
    chord = []
    for i in range(n - 1):
        d = vsub(points[i + 1], points[i])
        sq = [mul(c, c) for c in d]
        chord.append(f32(math.sqrt(_np_sum_f32(sq))))
    total = _np_sum_f32(chord)
    chord = [f32(c / total) for c in chord]
    cumarc = [0.0]
    acc = 0.0
    for c in chord:  # np.cumsum in float32, stored into a float64 array
        acc = f32(acc + c)
        cumarc.append(acc)
    out = []
    for e in eq:
        tb = bisect.bisect_right(cumarc, e)  # np.digitize(e, cumarc), right=False
        if tb <= 0 or e <= 0:
            tb = 1
        if tb >= n or e >= 1:
            tb = n - 1
        s = (e - cumarc[tb - 1]) / chord[tb - 1]  # float64 / float32 -> float64
        a, b = points[tb - 1], points[tb]
        out.append(tuple(a[c] + sub(b[c], a[c]) * s for c in range(3)))
    return out


def compute_midpoint_line(left, right, num_interp_pts):
    le = interp_arc(num_interp_pts, left)
    ri = interp_arc(num_interp_pts, right)
    return [tuple((p + q) / 2.0 for p, q in zip(a, b)) for a, b in zip(le, ri)]


# ---- tracks ------------------------------------------------------------------------------------

def read_tracks_parquet(path):
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ScenarioError('reading %s needs pyarrow (pip install pyarrow), or pass --jsonl-root '
                            'with the scenario as JSON lines' % path) from e
    table = pq.read_table(path, columns=TRACK_COLUMNS)
    cols = {c: table.column(c).to_pylist() for c in TRACK_COLUMNS}
    return [dict(zip(TRACK_COLUMNS, row)) for row in zip(*(cols[c] for c in TRACK_COLUMNS))]


def read_tracks_jsonl(path):
    rows = []
    with open(path, encoding='utf-8') as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ScenarioError('%s: line %d: %s' % (path, ln, e)) from e
            rows.append({c: r.get(c) for c in TRACK_COLUMNS})
    return rows


def agent_features(rows, where):
    """get_agent_features (train/val split, predict_unseen_agents False, vector_repr True)."""
    for i, r in enumerate(rows):
        for c in TRACK_COLUMNS:
            if r[c] is None:
                raise ScenarioError('%s: row %d: column %s is missing' % (where, i, c))
        if not isinstance(r['timestep'], int) or not 0 <= r['timestep'] < S:
            raise ScenarioError('%s: row %d: timestep %r outside [0, %d)' % (where, i,
                                                                             r['timestep'], S))
    agent_ids = []
    seen = set()
    for r in rows:  # first appearance among the history rows (pandas unique order)
        if r['timestep'] < T_HIST and r['track_id'] not in seen:
            seen.add(r['track_id'])
            agent_ids.append(r['track_id'])
    if 'AV' not in seen:
        raise ScenarioError('%s: no track "AV" in the history steps' % where)
    A = len(agent_ids)
    index = {t: i for i, t in enumerate(agent_ids)}
    tracks = {}
    for r in rows:
        if r['track_id'] in index:
            tracks.setdefault(r['track_id'], []).append(r)
    valid = bytearray(A * S)
    predict = bytearray(A * S)
    atype = bytearray(A)
    acat = bytearray(A)
    pos = [0.0] * (A * S * 3)
    head = [0.0] * (A * S)
    vel = [0.0] * (A * S * 3)
    for tid in sorted(tracks):  # df.groupby('track_id')
        trs = tracks[tid]
        a = index[tid]
        raw = [False] * S
        for r in trs:
            raw[r['timestep']] = True
        cur = raw[T_HIST - 1]
        for t in range(S):
            valid[a * S + t] = raw[t]
            predict[a * S + t] = raw[t]
        for t in range(1, T_HIST):  # vector_repr
            valid[a * S + t] = raw[t - 1] and raw[t]
        valid[a * S] = False
        for t in range(T_HIST):
            predict[a * S + t] = False
        if not cur:
            for t in range(T_HIST, S):
                predict[a * S + t] = False
        ot = trs[0]['object_type']
        if ot not in AGENT_TYPES:
            raise ScenarioError('%s: track %s: unknown object_type %r' % (where, tid, ot))
        atype[a] = AGENT_TYPES.index(ot)
        cat = trs[0]['object_category']
        if not isinstance(cat, int) or not 0 <= cat <= 3:
            raise ScenarioError('%s: track %s: object_category %r outside 0..3' % (where, tid, cat))
        acat[a] = cat
        for r in trs:
            t = r['timestep']
            vals = f32v([r['position_x'], r['position_y'], r['heading'], r['velocity_x'],
                         r['velocity_y']])
            if not all(math.isfinite(v) for v in vals):
                raise ScenarioError('%s: track %s step %d: non-finite value' % (where, tid, t))
            pos[(a * S + t) * 3], pos[(a * S + t) * 3 + 1] = vals[0], vals[1]
            head[a * S + t] = vals[2]
            vel[(a * S + t) * 3], vel[(a * S + t) * 3 + 1] = vals[3], vals[4]
    for tid in agent_ids:
        if len(tid.encode('utf-8')) > 31:
            raise ScenarioError('%s: track id %r longer than 31 bytes' % (where, tid))
    return {
        'A': A, 'av_index': index['AV'], 'ids': agent_ids, 'valid': bytes(valid),
        'predict': bytes(predict), 'type': bytes(atype), 'category': bytes(acat),
        'position': pos, 'heading': head, 'velocity': vel,
        'city': rows[0]['city'] if rows else '',
    }


# ---- map ---------------------------------------------------------------------------------------

def _xyz(pts, where):
    try:
        return [tuple(f32v([p['x'], p['y'], p.get('z', 0.0)])) for p in pts]
    except (KeyError, TypeError) as e:
        raise ScenarioError('%s: malformed polyline vertex (%s)' % (where, e)) from e


def _vectors(poly):
    return [vsub(poly[i + 1], poly[i]) for i in range(len(poly) - 1)]


def map_features(m, where):
    """get_map_features: polygons P = L + 2C, points, pt2pl, typed pl2pl."""
    try:
        lanes = list(m['lane_segments'].values())
        crosswalks = list(m['pedestrian_crossings'].values())
    except (KeyError, AttributeError, TypeError) as e:
        raise ScenarioError('%s: map JSON lacks lane_segments / pedestrian_crossings' % where) from e
    lane_ids = [ls['id'] for ls in lanes]
    cw_ids = [c['id'] for c in crosswalks]
    polygon_ids = lane_ids + cw_ids
    pindex = {}
    for i, pid in enumerate(polygon_ids):
        pindex.setdefault(pid, i)
    L, C = len(lanes), len(crosswalks)
    P = L + 2 * C
    pl_pos = [(0.0, 0.0, 0.0)] * P
    pl_or = [0.0] * P
    pl_h = [0.0] * P
    pl_type = [0] * P
    pl_int = [0] * P
    pts = [None] * P  # per polygon: list of (pos3, orient, magnitude, height, type, side)

    def group(starts, vecs, ptype, side):
        return [(starts[i], atan2_f(v[1], v[0]), norm2_f(v[0], v[1]), v[2], ptype, side)
                for i, v in enumerate(vecs)]

    for i, ls in enumerate(lanes):
        w = '%s: lane %s' % (where, ls.get('id'))
        try:
            cl = _xyz(ls['centerline'], w)
            lb = _xyz(ls['left_lane_boundary'], w)
            rb = _xyz(ls['right_lane_boundary'], w)
            lt, rt = ls['left_lane_mark_type'], ls['right_lane_mark_type']
            ty, inter = ls['lane_type'], ls['is_intersection']
        except KeyError as e:
            raise ScenarioError('%s: missing key %s' % (w, e)) from e
        if len(cl) < 2 or len(lb) < 1 or len(rb) < 1:
            raise ScenarioError('%s: centerline needs 2 vertices, boundaries 1' % w)
        if ty not in POLYGON_TYPES or inter not in POLYGON_IS_INTERSECTIONS:
            raise ScenarioError('%s: lane_type %r / is_intersection %r not in the vocabulary'
                                % (w, ty, inter))
        if lt not in POINT_TYPES or rt not in POINT_TYPES:
            raise ScenarioError('%s: lane mark type %r / %r not in the vocabulary' % (w, lt, rt))
        pl_pos[i] = cl[0]
        pl_or[i] = atan2_f(sub(cl[1][1], cl[0][1]), sub(cl[1][0], cl[0][0]))
        pl_h[i] = sub(cl[1][2], cl[0][2])
        pl_type[i] = POLYGON_TYPES.index(ty)
        pl_int[i] = POLYGON_IS_INTERSECTIONS.index(inter)
        pts[i] = (group(lb[:-1], _vectors(lb), POINT_TYPES.index(lt), 0) +
                  group(rb[:-1], _vectors(rb), POINT_TYPES.index(rt), 1) +
                  group(cl[:-1], _vectors(cl), POINT_TYPES.index('CENTERLINE'), 2))

    cwt, ct = POINT_TYPES.index('CROSSWALK'), POINT_TYPES.index('CENTERLINE')
    for c, cw in enumerate(crosswalks):
        w = '%s: crosswalk %s' % (where, cw.get('id'))
        try:
            e1 = _xyz(cw['edge1'], w)
            e2 = _xyz(cw['edge2'], w)
        except KeyError as e:
            raise ScenarioError('%s: missing key %s' % (w, e)) from e
        if len(e1) < 2 or len(e2) < 2:
            raise ScenarioError('%s: edges need 2 vertices' % w)
        start = vmid(e1[0], e2[0])
        end = vmid(e1[-1], e2[-1])
        fi, ri = L + c, L + C + c
        pl_pos[fi], pl_pos[ri] = start, end
        d = vsub(end, start)
        nd = vsub(start, end)
        pl_or[fi] = atan2_f(d[1], d[0])
        pl_or[ri] = atan2_f(nd[1], nd[0])
        pl_h[fi] = sub(end[2], start[2])
        pl_h[ri] = sub(start[2], end[2])
        pl_type[fi] = pl_type[ri] = POLYGON_TYPES.index('PEDESTRIAN')
        pl_int[fi] = pl_int[ri] = POLYGON_IS_INTERSECTIONS.index(None)
        q = vmid(e1[0], e1[-1])  # side_to_directed_lineseg(q, start, end)
        cond = sub(mul(sub(end[0], start[0]), sub(q[1], start[1])),
                   mul(sub(q[0], start[0]), sub(end[1], start[1])))
        left, right = (e1, e2) if cond > 0 else (e2, e1)
        n = math.ceil(norm3_f(*d) / 2.0) + 1
        cl = [tuple(f32v(p)) for p in compute_midpoint_line(left, right, int(n))]
        lv, rv, cv = _vectors(left), _vectors(right), _vectors(cl)
        pts[fi] = (group(left[:-1], lv, cwt, 0) + group(right[:-1], rv, cwt, 1) +
                   group(cl[:-1], cv, ct, 2))

        def rev(poly, vecs):
            return list(reversed(poly))[:-1], [tuple(-x for x in v) for v in reversed(vecs)]

        rs, rvv = rev(right, rv)
        ls_, lvv = rev(left, lv)
        cs, cvv = rev(cl, cv)
        pts[ri] = group(rs, rvv, cwt, 0) + group(ls_, lvv, cwt, 1) + group(cs, cvv, ct, 2)

    edges, etypes = [], []
    for i, ls in enumerate(lanes):
        for key, ty in (('predecessors', 'PRED'), ('successors', 'SUCC')):
            for other in ls.get(key) or []:
                j = pindex.get(other)
                if j is not None:
                    edges.append((j, i))
                    etypes.append(PL2PL_TYPES.index(ty))
        for key, ty in (('left_neighbor_id', 'LEFT'), ('right_neighbor_id', 'RIGHT')):
            other = ls.get(key)
            if other is not None:
                j = pindex.get(other)
                if j is not None:
                    edges.append((j, i))
                    etypes.append(PL2PL_TYPES.index(ty))
    return {'P': P, 'pl_pos': pl_pos, 'pl_or': pl_or, 'pl_h': pl_h, 'pl_type': pl_type,
            'pl_int': pl_int, 'pts': pts, 'edges': edges, 'etypes': etypes}


# ---- the qcshard record (docs/QCSHARD.md) ----------------------------------------------------------

def _pad8(b):
    b += b'\0' * ((-len(b)) % 8)


def _c_str(s, n, what):
    raw = s.encode('utf-8')
    if len(raw) >= n:
        raise ScenarioError('%s %r longer than %d bytes' % (what, s, n - 1))
    return raw + b'\0' * (n - len(raw))


def record(scenario_id, ag, mp):
    A, P = ag['A'], mp['P']
    flat = [p for poly in mp['pts'] for p in poly]
    Pt, Et = len(flat), len(mp['edges'])
    out = bytearray(b'QCSC' + struct.pack('<I5q', 0, A, P, Pt, Et, ag['av_index']))
    out += _c_str(scenario_id, 64, 'scenario_id') + _c_str(ag['city'] or '', 32, 'city')
    assert len(out) == 144

    def put(b):
        out.extend(b)
        _pad8(out)

    put(ag['valid'])
    put(ag['predict'])
    put(ag['type'])
    put(ag['category'])
    put(array.array('f', ag['position']).tobytes())
    put(array.array('f', ag['heading']).tobytes())
    put(array.array('f', ag['velocity']).tobytes())
    put(b''.join(_c_str(t, 32, 'track id') for t in ag['ids']))
    put(array.array('f', [c for p in mp['pl_pos'] for c in p]).tobytes())
    put(array.array('f', mp['pl_or']).tobytes())
    put(array.array('f', mp['pl_h']).tobytes())
    put(bytes(mp['pl_type']))
    put(bytes(mp['pl_int']))
    put(array.array('f', [c for p in flat for c in p[0]]).tobytes())
    put(array.array('f', [p[1] for p in flat]).tobytes())
    put(array.array('f', [p[2] for p in flat]).tobytes())
    put(array.array('f', [p[3] for p in flat]).tobytes())
    put(bytes(p[4] for p in flat))
    put(bytes(p[5] for p in flat))
    owner = [i for i, poly in enumerate(mp['pts']) for _ in poly]
    put(struct.pack('<%dq' % (2 * Pt), *(list(range(Pt)) + owner)))
    put(struct.pack('<%dq' % (2 * Et), *([e[0] for e in mp['edges']] + [e[1] for e in mp['edges']])))
    put(bytes(mp['etypes']))
    if sys_byteorder_is_big():
        raise ScenarioError('big-endian hosts are not supported')
    for v in mp['pl_or'] + mp['pl_h'] + [x for p in flat for x in p[0] + p[1:4]]:
        if not math.isfinite(v):
            raise ScenarioError('non-finite map value')
    return bytes(out), (A, P, Pt, Et)


def sys_byteorder_is_big():
    import sys
    return sys.byteorder != 'little'


def find_files(scenario_dir):
    """(scenario_id, parquet path or None, map path) of a scenario folder."""
    sid = os.path.basename(os.path.normpath(scenario_dir))
    pq = os.path.join(scenario_dir, 'scenario_%s.parquet' % sid)
    maps = sorted(glob.glob(os.path.join(scenario_dir, 'log_map_archive_*.json')))
    return sid, pq, (maps[0] if maps else None)


def convert_scenario(scenario_dir, jsonl_root=None):
    """Returns (scenario_id, record bytes, counts) or raises ScenarioError."""
    sid, pq, mpath = find_files(scenario_dir)
    where = 'scenario %s (%s)' % (sid, scenario_dir)
    if mpath is None:
        raise ScenarioError('%s: no log_map_archive_*.json' % where)
    if jsonl_root:
        tracks = os.path.join(jsonl_root, sid, 'scenario_%s.jsonl' % sid)
        if not os.path.exists(tracks):
            raise ScenarioError('%s: %s not found' % (where, tracks))
        rows = read_tracks_jsonl(tracks)
    else:
        if not os.path.exists(pq):
            raise ScenarioError('%s: %s not found' % (where, pq))
        rows = read_tracks_parquet(pq)
    if not rows:
        raise ScenarioError('%s: no track rows' % where)
    try:
        with open(mpath, encoding='utf-8') as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ScenarioError('%s: cannot read map %s: %s' % (where, mpath, e)) from e
    ag = agent_features(rows, where)
    mp = map_features(m, where)
    rec, counts = record(sid, ag, mp)
    return sid, rec, counts
