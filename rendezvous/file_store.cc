#include "rendezvous/file_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "common/errors.h"
#include "common/file_io.h"
#include "rendezvous/kv_space.h"

namespace ddpl::rdzv {
namespace {

constexpr char kMagic[] = "DDPLFS1\n";
constexpr size_t kMagicLen = sizeof(kMagic) - 1;

std::string sysError(const std::string& what, const std::string& path) {
  return fmt::format("file store {}: {}: {}", path, what, std::strerror(errno));
}

void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t getU32(const std::string& in, size_t pos) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<uint8_t>(in[pos + i])) << (8 * i);
  return v;
}


}  // namespace

class FileStore::Locked {
 public:
  Locked(FileStore& fs, bool exclusive) : fs_(fs), lock_(fs.mu_) {
    while (flock(fs_.fd_, exclusive ? LOCK_EX : LOCK_SH) != 0) {
      if (errno != EINTR) throw StoreError(sysError("flock", fs_.path_));
    }
    load();
  }
  ~Locked() { flock(fs_.fd_, LOCK_UN); }

  std::map<std::string, Bytes>& data() { return data_; }

  void save() {
    std::string out(kMagic, kMagicLen);
    for (const auto& [k, v] : data_) {
      putU32(out, static_cast<uint32_t>(k.size()));
      putU32(out, static_cast<uint32_t>(v.size()));
      out += k;
      out.append(reinterpret_cast<const char*>(v.data()), v.size());
    }
    if (ftruncate(fs_.fd_, 0) != 0) throw StoreError(sysError("truncate", fs_.path_));
    if (const int e = pwriteAll(fs_.fd_, out.data(), out.size(), 0)) {
      errno = e;
      throw StoreError(sysError("write", fs_.path_));
    }
  }

 private:
  void load() {
    std::string in;
    char buf[65536];
    off_t off = 0;
    for (;;) {
      ssize_t n = pread(fs_.fd_, buf, sizeof(buf), off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw StoreError(sysError("read", fs_.path_));
      if (n == 0) break;
      in.append(buf, static_cast<size_t>(n));
      off += n;
    }
    if (in.empty()) return;  // a new store
    if (in.compare(0, kMagicLen, kMagic) != 0)
      throw StoreError(fmt::format("file store {}: not a ddplaunch store file", fs_.path_));
    size_t pos = kMagicLen;
    while (pos < in.size()) {
      if (in.size() - pos < 8)
        throw StoreError(fmt::format("file store {}: truncated at byte {}", fs_.path_, pos));
      uint32_t kl = getU32(in, pos), vl = getU32(in, pos + 4);
      pos += 8;
      if (in.size() - pos < static_cast<size_t>(kl) + vl)
        throw StoreError(fmt::format("file store {}: truncated at byte {}", fs_.path_, pos));
      std::string key = in.substr(pos, kl);
      pos += kl;
      data_[key] = Bytes(in.begin() + static_cast<std::ptrdiff_t>(pos),
                         in.begin() + static_cast<std::ptrdiff_t>(pos + vl));
      pos += vl;
    }
  }

  FileStore& fs_;
  std::lock_guard<std::mutex> lock_;
  std::map<std::string, Bytes> data_;
};

FileStore::FileStore(std::string path) : path_(std::move(path)) {
  fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) throw StoreError(sysError("open", path_));
}

FileStore::~FileStore() {
  if (fd_ >= 0) close(fd_);
}

void FileStore::set(const std::string& key, const Bytes& value) {
  Locked l(*this, true);
  l.data()[key] = value;
  l.save();
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  Locked l(*this, true);
  auto it = l.data().find(key);
  int64_t v = addCounter(key, it == l.data().end() ? 0 : parseCounter(key, it->second), delta);
  l.data()[key] = toBytes(std::to_string(v));
  l.save();
  return v;
}

Bytes FileStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Locked l(*this, true);
  auto it = l.data().find(key);
  if (it == l.data().end()) {
    if (!expected.empty()) return expected;
    l.data()[key] = desired;
    l.save();
    return desired;
  }
  if (it->second != expected) return it->second;
  it->second = desired;
  l.save();
  return desired;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  Locked l(*this, false);
  for (const auto& k : keys)
    if (!l.data().count(k)) return false;
  return true;
}

bool FileStore::deleteKey(const std::string& key) {
  Locked l(*this, true);
  bool existed = l.data().erase(key) > 0;
  if (existed) l.save();
  return existed;
}

int64_t FileStore::numKeys() {
  Locked l(*this, false);
  return static_cast<int64_t>(l.data().size());
}

void FileStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument(
        fmt::format("multiSet: {} keys but {} values", keys.size(), values.size()));
  Locked l(*this, true);
  for (size_t i = 0; i < keys.size(); ++i) l.data()[keys[i]] = values[i];
  l.save();
}

std::vector<Bytes> FileStore::waitFor(const std::vector<std::string>& keys, Duration timeout,
                                      bool want_values, const char* op) {
  // The watch is set up before the first look, so a write between the look and the sleep
  // still wakes us.
  int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (ino < 0) throw StoreError(sysError("inotify_init1", path_));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{ino};
  if (inotify_add_watch(ino, path_.c_str(), IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB) < 0)
    throw StoreError(sysError("inotify_add_watch", path_));
  auto deadline = Clock::now() + timeout;
  for (;;) {
    std::vector<std::string> missing;
    {
      Locked l(*this, false);
      for (const auto& k : keys)
        if (!l.data().count(k)) missing.push_back(k);
      if (missing.empty()) {
        std::vector<Bytes> out;
        if (want_values)
          for (const auto& k : keys) out.push_back(l.data().at(k));
        return out;
      }
    }
    auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    if (left.count() <= 0) {
      if (keys.size() == 1)
        throw TimeoutError(fmt::format("timed out after {}ms in {} waiting for key '{}' ({})",
                                       timeout.count(), op, keys[0], path_));
      throw TimeoutError(fmt::format("timed out after {}ms in {} waiting for {}/{} keys: {} ({})",
                                     timeout.count(), op, missing.size(), keys.size(),
                                     quoteKeys(missing), path_));
    }
    pollfd p{ino, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, INT32_MAX)));
    if (r < 0 && errno != EINTR) throw StoreError(sysError("poll", path_));
    char drain[4096];
    while (read(ino, drain, sizeof(drain)) > 0) {
    }
  }
}

Bytes FileStore::get(const std::string& key, Duration timeout) {
  return waitFor({key}, timeout, true, "get").at(0);
}

void FileStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  waitFor(keys, timeout, false, "wait");
}

std::vector<Bytes> FileStore::multiGet(const std::vector<std::string>& keys, Duration timeout) {
  return waitFor(keys, timeout, true, "multiGet");
}

}  // namespace ddpl::rdzv
