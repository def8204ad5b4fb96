#!/usr/bin/env python3
"""Writes tests/data/tb_fixture.tfevents: four TensorBoard records made by TensorBoard's own
code (the pip package's protobuf classes and its RecordWriter), which tests/test_tb.c compares
byte for byte with qctrain's hand-written encoder (src/report/tb_event.c). Generated once with
tensorboard 2.21.0 and committed; rerun only to check against another tensorboard version:

    python3 tests/data/make_tb_fixture.py tests/data/tb_fixture.tfevents
"""
import io
import sys

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter


def events():
    yield event_pb2.Event(wall_time=1700000000.5, file_version="brain.Event:2")
    yield event_pb2.Event(wall_time=1700000001.25, step=101,
                          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
    values = [("train/loss", 26.1272), ("train/lr", 0.002),
              ("memory/peak_device_bytes", 288384512.0), ("train/cls_loss", 0.0)]
    yield event_pb2.Event(wall_time=1700000002.0, step=102, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values]))
    yield event_pb2.Event(wall_time=1700000003.0, step=399872, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="eval/minFHE", simple_value=-1.5)]))


def main():
    buf = io.BytesIO()
    w = RecordWriter(buf)
    for e in events():
        w.write(e.SerializeToString())
    with open(sys.argv[1], "wb") as f:
        f.write(buf.getvalue())


if __name__ == "__main__":
    main()
