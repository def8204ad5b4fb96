# fp16 dynamic loss scaling as a unit (src/train/loss_scale.c, test_loss_scale.c): the first
# scale, the resume rule, the unscale of exactly grads[lo, hi) by the power of 2, the overflow's
# halving and skip, the window's doubling and cap, fp32 / bf16 untouched, the overflow hook.
qc_add_test(test_loss_scale SOURCES test_loss_scale.c LIBS qctrainer qcconfig LABELS cpu
    TIMEOUT 60)
