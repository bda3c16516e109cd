// A slow disk for one directory, by LD_PRELOAD: every write(2) to a file under
// $DDPL_TEST_SLOW_DIR sleeps $DDPL_TEST_SLOW_MS milliseconds first (fsync too). The memory
// checkpoint test runs launch with it, so that launch's background copies lag behind the
// training that commits them; nothing else is slowed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int slowed(int fd) {
  const char* dir = getenv("DDPL_TEST_SLOW_DIR");
  if (!dir || !*dir) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  size_t len = strlen(dir);
  return strncmp(path, dir, len) == 0 && (path[len] == '/' || path[len] == '\0');
}

static void pause_if_slowed(int fd) {
  if (!slowed(fd)) return;
  const char* ms = getenv("DDPL_TEST_SLOW_MS");
  long v = ms ? strtol(ms, NULL, 10) : 100;
  struct timespec t = {v / 1000, (v % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

ssize_t write(int fd, const void* buf, size_t count) {
  static ssize_t (*real)(int, const void*, size_t);
  if (!real) real = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  pause_if_slowed(fd);
  return real(fd, buf, count);
}

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  pause_if_slowed(fd);
  return real(fd);
}
