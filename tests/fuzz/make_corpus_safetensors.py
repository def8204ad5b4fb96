#!/usr/bin/env python3
"""
make_corpus_safetensors.py — writes the hand-made seeds of tests/fuzz/corpus_safetensors/: valid
files that reach every branch of the reader's accepted path (each dtype, a scalar, empty
tensors, a tensor misaligned for its type, space padding, metadata) and malformed ones, one per
check of src/data/safetensors.c, named for the check they hit: ok_* must be accepted, bad_* refused
(test_safetensors_corpus checks that, and the message, in every build; the fuzz build replays
them too, fuzz_safetensors_corpus); .ci/run fuzzes from them.

The two seeds of the tiny model (ok_init_from.safetensors, ok_resume_optim.safetensors) are
written by the fuzz target itself:
  QC_FUZZ_WRITE_SEEDS=tests/fuzz/corpus_safetensors build-fuzz/fuzz/fuzz_safetensors

usage: make_corpus_safetensors.py [OUT_DIR]   (default: corpus_safetensors next to this file)
"""
import json
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                          'corpus_safetensors')
SIZES = {'BOOL': 1, 'U8': 1, 'I8': 1, 'I16': 2, 'U16': 2, 'F16': 2, 'BF16': 2, 'I32': 4, 'U32': 4,
         'F32': 4, 'I64': 8, 'U64': 8, 'F64': 8}


def image(header, data=b'', pad=0, hlen=None):
    """The file: 8-byte length, the header (str or bytes, padded with spaces), the data."""
    h = header if isinstance(header, bytes) else header.encode()
    h += b' ' * pad
    n = len(h) if hlen is None else hlen
    return struct.pack('<Q', n) + h + data


def tensors(entries, meta=None, align=8):
    """entries: [(name, dtype, shape)]: a valid file, laid out in the given order; data bytes
    count up. align 8 pads the header so that 8-byte types are aligned."""
    hdr, off, data = {}, 0, b''
    if meta is not None:
        hdr['__metadata__'] = meta
    for name, dt, shape in entries:
        n = SIZES[dt]
        for s in shape:
            n *= s
        hdr[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + n]}
        data += bytes((off + i) % 251 for i in range(n))
        off += n
    h = json.dumps(hdr, separators=(',', ':'))
    pad = (-(8 + len(h))) % align
    return image(h, data, pad)


def raw(hdr_obj, data):
    return image(json.dumps(hdr_obj, separators=(',', ':')), data)


def main():
    os.makedirs(OUT, exist_ok=True)
    accepted = {
        'every_dtype': tensors([(d.lower(), d, [2, 3]) for d in SIZES],
                               meta={'format': 'pt', 'note': 'every dtype'}),
        'scalar_and_empty': tensors([('s', 'F64', []), ('e', 'F32', [0, 5]), ('z', 'I8', [0]),
                                     ('v', 'F32', [3])]),
        'misaligned_f32': tensors([('b', 'U8', [3]), ('f', 'F32', [2, 2]), ('d', 'F64', [1])],
                                  align=1),
        'eight_dims': tensors([('t', 'F16', [1, 2, 1, 2, 1, 2, 1, 2])]),
        'space_padded': image('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
                              b'\0\0\x80?', pad=37),
        'empty_file_header': image('{}'),
        'metadata_only': image(json.dumps({'__metadata__': {'k': 'v', 'esc': 'a"\\\n\u00e9'}})),
        'escaped_names': tensors([('we\u00efrd "name"\\\t', 'U8', [2]), ('\u2603', 'I16', [1])]),
        'order_differs_from_offsets': raw(
            {'late': {'dtype': 'U8', 'shape': [2], 'data_offsets': [2, 4]},
             'early': {'dtype': 'U8', 'shape': [2], 'data_offsets': [0, 2]}}, b'abcd'),
    }
    rejected = {
        'too_short': b'\x05\0\0\0',
        'header_length_zero': struct.pack('<Q', 0) + b'{}',
        'header_length_past_end': image('{}', hlen=1000),
        'header_not_object_start': image('[1]'),
        'header_nul_byte': image(b'{"a\0":1}'),
        'header_not_json': image('{"a":'),
        'header_trailing_byte': image('{} x'),
        'entry_not_object': raw({'a': 5}, b''),
        'entry_extra_field': raw({'a': {'dtype': 'U8', 'shape': [1], 'data_offsets': [0, 1],
                                        'x': 1}}, b'a'),
        'entry_missing_offsets': raw({'a': {'dtype': 'U8', 'shape': [1]}}, b'a'),
        'dtype_not_string': raw({'a': {'dtype': 4, 'shape': [1], 'data_offsets': [0, 1]}}, b'a'),
        'dtype_unknown': raw({'a': {'dtype': 'F8', 'shape': [1], 'data_offsets': [0, 1]}}, b'a'),
        'shape_not_array': raw({'a': {'dtype': 'U8', 'shape': 1, 'data_offsets': [0, 1]}}, b'a'),
        'shape_nine_dims': raw({'a': {'dtype': 'U8', 'shape': [1] * 9, 'data_offsets': [0, 1]}},
                               b'a'),
        'shape_negative': raw({'a': {'dtype': 'U8', 'shape': [-1], 'data_offsets': [0, 1]}},
                              b'a'),
        'shape_fraction': raw({'a': {'dtype': 'U8', 'shape': [1.5], 'data_offsets': [0, 1]}},
                              b'a'),
        'shape_2p53_plus_1': image('{"a":{"dtype":"U8","shape":[9007199254740993],'
                                  '"data_offsets":[0,1]}}', b'a'),
        'shape_overflow': raw({'a': {'dtype': 'U8', 'shape': [2 ** 40, 2 ** 40],
                                     'data_offsets': [0, 1]}}, b'a'),
        'bytes_overflow': raw({'a': {'dtype': 'F64', 'shape': [2 ** 31, 2 ** 31],
                                     'data_offsets': [0, 1]}}, b'a'),
        'offsets_not_pair': raw({'a': {'dtype': 'U8', 'shape': [1], 'data_offsets': [0]}}, b'a'),
        'offsets_reversed': raw({'a': {'dtype': 'U8', 'shape': [1], 'data_offsets': [1, 0]}},
                                b'a'),
        'offsets_wrong_length': raw({'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 4]}},
                                    b'abcd'),
        'offsets_hole': raw({'a': {'dtype': 'U8', 'shape': [1], 'data_offsets': [1, 2]}}, b'ab'),
        'offsets_overlap': raw({'a': {'dtype': 'U8', 'shape': [2], 'data_offsets': [0, 2]},
                                'b': {'dtype': 'U8', 'shape': [2], 'data_offsets': [1, 3]}},
                               b'abc'),
        'data_truncated': raw({'a': {'dtype': 'U8', 'shape': [4], 'data_offsets': [0, 4]}}, b'ab'),
        'data_trailing': raw({'a': {'dtype': 'U8', 'shape': [1], 'data_offsets': [0, 1]}}, b'ab'),
        'name_empty': raw({'': {'dtype': 'U8', 'shape': [1], 'data_offsets': [0, 1]}}, b'a'),
        'name_twice': image('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                            '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b'ab'),
        'name_twice_after_nul': image('{"a\\u0000x":{"dtype":"U8","shape":[1],'
                                      '"data_offsets":[0,1]},"a\\u0000y":{"dtype":"U8",'
                                      '"shape":[1],"data_offsets":[1,2]}}', b'ab'),
        'metadata_not_object': raw({'__metadata__': 'x'}, b''),
        'metadata_value_not_string': raw({'__metadata__': {'k': 1}}, b''),
        'metadata_key_twice': image('{"__metadata__":{"k":"a","k":"b"}}'),
        'metadata_twice': image('{"__metadata__":{},"__metadata__":{}}'),
    }
    for prefix, seeds in (('ok_', accepted), ('bad_', rejected)):
        for name, blob in seeds.items():
            with open(os.path.join(OUT, prefix + name + '.safetensors'), 'wb') as f:
                f.write(blob)
    print('%d seeds in %s' % (len(accepted) + len(rejected), OUT))


if __name__ == '__main__':
    main()
