/*
 * shm_hash.h -- the stable hash of a lock table's keys (docs/design.md §15): the same
 * value in every process, on every run, Python version and machine word order.
 *
 * The 64-bit hash is XXH64 (Yann Collet's xxHash, 64-bit variant), with its published
 * constants and its own avalanche as the finaliser; every multi-byte read is little
 * endian whatever the machine, as the algorithm specifies.  Reference values (seed 0):
 * XXH64("") = 0xEF46DB3751D8E999, XXH64("a") = 0xD24EC4F1A98C6E5B,
 * XXH64("abc") = 0x44BC2CF5AD770999.  A stripe index in [0, size) is Lemire's
 * multiply-shift of that hash: (h * size) >> 64, in 128-bit arithmetic (no division, and
 * every bit of h counts).  How a key becomes bytes (str, bytes, int, tuple) is the
 * table layer's (_ext/table/table.pxi, shmlocks_index_of).
 */
#ifndef SHM_HASH_H
#define SHM_HASH_H

#include <stdint.h>
#include <stddef.h>

#define SHM_XXH_P1 0x9E3779B185EBCA87ULL
#define SHM_XXH_P2 0xC2B2AE3D27D4EB4FULL
#define SHM_XXH_P3 0x165667B19E3779F9ULL
#define SHM_XXH_P4 0x85EBCA77C2B2AE63ULL
#define SHM_XXH_P5 0x27D4EB2F165667C5ULL
/* the seed of a tuple's hash (the bytes "TUPLE", read as a big-endian number): a tuple
   hashes the little-endian 64-bit hashes of its elements, in order, with it */
#define SHM_HASH_TUPLE_SEED 0x5455504C45ULL

static inline uint64_t shm_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t shm_le64(const unsigned char *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24
        | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48
        | (uint64_t)p[7] << 56;
}

static inline uint32_t shm_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t shm_xxh_round(uint64_t acc, uint64_t input) {
    acc += input * SHM_XXH_P2;
    acc = shm_rotl64(acc, 31);
    return acc * SHM_XXH_P1;
}

static inline uint64_t shm_xxh_merge(uint64_t acc, uint64_t val) {
    acc ^= shm_xxh_round(0, val);
    return acc * SHM_XXH_P1 + SHM_XXH_P4;
}

static inline uint64_t shm_xxh64(const void *data, size_t len, uint64_t seed) {
    const unsigned char *p = (const unsigned char *)data;
    const unsigned char *end = p + len;
    uint64_t h;
    if (len >= 32) {
        const unsigned char *limit = end - 32;
        uint64_t v1 = seed + SHM_XXH_P1 + SHM_XXH_P2, v2 = seed + SHM_XXH_P2;
        uint64_t v3 = seed, v4 = seed - SHM_XXH_P1;
        do {
            v1 = shm_xxh_round(v1, shm_le64(p));
            v2 = shm_xxh_round(v2, shm_le64(p + 8));
            v3 = shm_xxh_round(v3, shm_le64(p + 16));
            v4 = shm_xxh_round(v4, shm_le64(p + 24));
            p += 32;
        } while (p <= limit);
        h = shm_rotl64(v1, 1) + shm_rotl64(v2, 7) + shm_rotl64(v3, 12) + shm_rotl64(v4, 18);
        h = shm_xxh_merge(h, v1);
        h = shm_xxh_merge(h, v2);
        h = shm_xxh_merge(h, v3);
        h = shm_xxh_merge(h, v4);
    } else {
        h = seed + SHM_XXH_P5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= shm_xxh_round(0, shm_le64(p));
        h = shm_rotl64(h, 27) * SHM_XXH_P1 + SHM_XXH_P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)shm_le32(p) * SHM_XXH_P1;
        h = shm_rotl64(h, 23) * SHM_XXH_P2 + SHM_XXH_P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * SHM_XXH_P5;
        h = shm_rotl64(h, 11) * SHM_XXH_P1;
        p++;
    }
    h ^= h >> 33;                          /* the avalanche: the finaliser */
    h *= SHM_XXH_P2;
    h ^= h >> 29;
    h *= SHM_XXH_P3;
    h ^= h >> 32;
    return h;
}

/* Lemire's multiply-shift: a hash to [0, size) */
static inline uint32_t shm_hash_index(uint64_t h, uint32_t size) {
    return (uint32_t)(((unsigned __int128)h * size) >> 64);
}

/* an int's minimal two's-complement big-endian bytes (0 -> one zero byte), for a value
   that fits in 64 bits: written at the end of out[9], returns how many */
static inline int shm_int_bytes(int64_t v, unsigned char out[9]) {
    int n = 0;
    uint64_t u = (uint64_t)v;
    do {
        out[8 - n] = (unsigned char)(u & 0xff);
        n++;
        u = (uint64_t)((int64_t)u >> 8);   /* arithmetic: keeps the sign */
    } while (!((v >= 0 && u == 0 && !(out[9 - n] & 0x80))
               || (v < 0 && u == UINT64_MAX && (out[9 - n] & 0x80))));
    return n;
}

#endif
