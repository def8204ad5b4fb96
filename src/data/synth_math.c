/*
 * synth_math.c — the generator's machine-independent numbers: xoshiro256** seeded through
 * splitmix64, and an atan2 built only from + - * / (so it gives the same bits everywhere,
 * unlike libm's).
 */
#include "synth_internal.h"

#include <math.h> /* sqrt: IEEE-754 correctly rounded, hence deterministic */

#include "qc_rand.h"

// ---- PRNG -----------------------------------------------------------------------------------

void synth_rng_seed(struct synth_rng *r, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t x = a ^ 0x51c7a11e5eedull;
    x = qc_splitmix64(&x) ^ b;
    x = qc_splitmix64(&x) ^ c;
    for (int i = 0; i < 4; i++)
        r->s[i] = qc_splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t synth_rng_u64(struct synth_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double synth_rng_unit(struct synth_rng *r)
{
    return (double)(synth_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

double synth_rng_range(struct synth_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * synth_rng_unit(r);
}

int64_t synth_rng_int(struct synth_rng *r, int64_t lo, int64_t hi)
{
    const uint64_t span = (uint64_t)(hi - lo) + 1u;
    return lo + (int64_t)(synth_rng_u64(r) % span); /* bias < 2^-40 for our spans */
}

int synth_rng_chance(struct synth_rng *r, double p)
{
    return synth_rng_unit(r) < p;
}

// ---- geometry -------------------------------------------------------------------------------

/* atan(x) for 0 <= x <= 1: one reduction by pi/6, then the odd Taylor series to x^23 on
 * |x| <= tan(pi/12) = 0.268 (truncation error < 0.268^25/25 < 1e-15). */
static double atan_unit(double x)
{
    static const double sqrt3 = 1.7320508075688772935;
    static const double tan_pi_12 = 0.26794919243112270647;
    double off = 0.0;
    if (x > tan_pi_12) {
        x = (x * sqrt3 - 1.0) / (x + sqrt3);
        off = SYNTH_PI / 6.0;
    }
    const double x2 = x * x;
    double p = 1.0 / 23.0;
    for (int k = 21; k >= 1; k -= 2)
        p = 1.0 / k - x2 * p;
    return off + x * p;
}

double synth_atan2(double y, double x)
{
    const double ax = x < 0 ? -x : x, ay = y < 0 ? -y : y;
    if (ax == 0.0 && ay == 0.0)
        return 0.0;
    double a = ay <= ax ? atan_unit(ay / ax) : SYNTH_PI / 2.0 - atan_unit(ax / ay);
    if (x < 0)
        a = SYNTH_PI - a;
    return y < 0 ? -a : a;
}

double synth_norm(struct synth_vec v)
{
    return sqrt(v.x * v.x + v.y * v.y);
}

struct synth_vec synth_unit(struct synth_vec v)
{
    const double n = synth_norm(v);
    if (n == 0.0)
        return synth_v(1.0, 0.0);
    return synth_v(v.x / n, v.y / n);
}
