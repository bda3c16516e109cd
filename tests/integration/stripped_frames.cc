// A shared library as vendors ship them: no symbol table, no debug information (linked with
// --strip-all). Its frames on a worker's stack must keep module + offset in the error file.
// Only the entry point is exported (.dynsym survives stripping); the trampoline is named nowhere.
extern "C" {
typedef void (*ddpl_test_callback)(void*);
__attribute__((visibility("default"))) void ddpl_test_call_through_stripped(ddpl_test_callback fn,
                                                                            void* arg);
}

namespace {
__attribute__((noinline)) void trampoline(ddpl_test_callback fn, void* arg) {
  fn(arg);
  asm volatile("");  // keeps this frame on the stack: no tail call
}
}  // namespace

void ddpl_test_call_through_stripped(ddpl_test_callback fn, void* arg) {
  trampoline(fn, arg);
  asm volatile("");
}
