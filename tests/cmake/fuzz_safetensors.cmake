# The safetensors reader (src/data/safetensors.c), which --init-from and --resume point at
# untrusted files:
#   test_safetensors_corpus (cpu, every build): the fuzz seeds as regression tests named for the
#     behaviour (ok_* open, bad_* refused naming their check) and a 100,000-tensor header.
#   fuzz_safetensors (-DQC_FUZZ=ON and clang only; tests/fuzz/fuzz_safetensors.c): the reader
#     under libFuzzer, with what --init-from (qc_qcnet_load_st) and --resume
#     (qc_checkpoint_read_state, the AdamW moments) do with a file it accepts; ctest replays its
#     corpus (fuzz_safetensors_corpus, label fuzz), .ci/run fuzzes it.
qc_add_test(test_safetensors_corpus SOURCES test_safetensors_corpus.c LIBS qcdata LABELS cpu
    TIMEOUT 120)
qc_add_fuzzer(fuzz_safetensors SOURCES fuzz/fuzz_safetensors.c
    LIBS qctrainer qcmodel qcdata qcconfig PkgConfig::CJSON m)
