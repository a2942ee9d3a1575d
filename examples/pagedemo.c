/* pagedemo: the program of `make demo`. It allocates MIB mebibytes (default
 * 256) with one malloc, writes a pattern over all of it, reads it back page by
 * page in another order and checks every word. Under `memagent run
 * --local-mem 64MiB` three quarters of it live in the pool at any time. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
int main(int argc, char **argv) {
  size_t mib = argc > 1 ? atoi(argv[1]) : 256;
  size_t pages = mib << 8, words = 512;
  uint64_t *a = malloc(mib << 20);
  if (!a) { perror("malloc"); return 1; }
  for (size_t i = 0; i < pages * words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
  uint64_t sum = 0, bad = 0;
  /* every page, in an order far from the writing one (a stride coprime with the page count) */
  for (size_t k = 0; k < pages; k++) {
    size_t p = (k * 40503) % pages;
    for (size_t w = 0; w < words; w++) { size_t i = p * words + w; uint64_t v = a[i]; bad += v != i * 0x9E3779B97F4A7C15ull; sum += v; }
  }
  printf("demo: %zu MiB written and read back in another order: %llu bad words, checksum %016llx\n", mib, (unsigned long long)bad, (unsigned long long)sum);
  free(a);
  return bad != 0;
}
