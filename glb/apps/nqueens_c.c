/* N-Queens speed reference: count all solutions with the classic bitboard search.
 *
 *     cc -O2 -o nqueens_c nqueens_c.c && ./nqueens_c 16
 *
 * Prints the number of solutions. Columns and both diagonals are bitmasks;
 * no symmetry is used, so it does the same search as the Numba kernel in
 * nqueens.py (glb/apps/nqueens.py times it with c_reference_seconds).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t solve(uint32_t full, uint32_t cols, uint32_t d1, uint32_t d2) {
    if (cols == full)
        return 1;
    uint64_t count = 0;
    uint32_t avail = full & ~(cols | d1 | d2);
    while (avail) {
        uint32_t bit = avail & -avail; /* lowest free square of this row */
        avail ^= bit;
        count += solve(full, cols | bit, ((d1 | bit) << 1) & full, (d2 | bit) >> 1);
    }
    return count;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 16;
    if (n < 1 || n > 31) {
        fprintf(stderr, "board size must be in 1..31, got %d\n", n);
        return 2;
    }
    printf("%llu\n", (unsigned long long)solve((UINT32_C(1) << n) - 1, 0, 0, 0));
    return 0;
}
