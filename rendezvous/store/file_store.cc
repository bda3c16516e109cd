#include "rendezvous/store/file_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "common/errors.h"
#include "common/file_io.h"
#include "rendezvous/store/kv_space.h"

namespace ddpl::rdzv {
namespace {

constexpr char kMagic[] = "DDPLFS2\n";
constexpr char kOldMagic[] = "DDPLFS1\n";
constexpr size_t kMagicLen = sizeof(kMagic) - 1;
// A frame: u32 length, then records. One frame per write, so that a write is all or nothing.
// A record: u8 op, u32 key length, u32 value length, key, value.
constexpr uint8_t kPut = 1, kErase = 2;
constexpr size_t kRecordHeader = 9;

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

void putRecord(std::string& out, uint8_t op, const std::string& key, const Bytes& value) {
  if (key.size() > UINT32_MAX || value.size() > UINT32_MAX)
    throw InvalidArgument(fmt::format("file store: key '{}' or its value is over 4 GiB", key));
  out.push_back(static_cast<char>(op));
  putU32(out, static_cast<uint32_t>(key.size()));
  putU32(out, static_cast<uint32_t>(value.size()));
  out += key;
  out.append(reinterpret_cast<const char*>(value.data()), value.size());
}

}  // namespace

class FileStore::Locked {
 public:
  Locked(FileStore& fs, bool exclusive) : fs_(fs), lock_(fs.mu_) {
    for (;;) {
      while (flock(fs_.fd_, exclusive ? LOCK_EX : LOCK_SH) != 0) {
        if (errno != EINTR) throw StoreError(sysError("flock", fs_.path_));
      }
      // A compaction renames a new file over the path, so the file this lock is on may no
      // longer be the store: then reopen the path and lock again.
      struct stat held {
      }, named{};
      if (fstat(fs_.fd_, &held) != 0) throw StoreError(sysError("fstat", fs_.path_));
      if (stat(fs_.path_.c_str(), &named) == 0) {
        if (named.st_ino == held.st_ino && named.st_dev == held.st_dev) break;
      } else if (errno != ENOENT) {
        throw StoreError(sysError("stat", fs_.path_));
      }
      flock(fs_.fd_, LOCK_UN);
      close(fs_.fd_);
      fs_.fd_ = -1;
      fs_.open();
    }
    try {
      load();
    } catch (...) {
      flock(fs_.fd_, LOCK_UN);
      throw;
    }
  }
  ~Locked() { flock(fs_.fd_, LOCK_UN); }

  const std::map<std::string, Bytes>& data() const { return data_; }

  void put(const std::string& key, const Bytes& value) {
    putRecord(pending_, kPut, key, value);
    data_[key] = value;
  }
  void erase(const std::string& key) {
    putRecord(pending_, kErase, key, {});
    data_.erase(key);
  }

  // Appends what put and erase recorded, as one frame, after the last complete one.
  void commit() {
    if (pending_.empty()) return;
    if (pending_.size() > UINT32_MAX)
      throw InvalidArgument(fmt::format("file store {}: one write over 4 GiB", fs_.path_));
    std::string frame;
    if (valid_ == 0) frame.assign(kMagic, kMagicLen);
    putU32(frame, static_cast<uint32_t>(pending_.size()));
    frame += pending_;
    // A torn frame from a writer killed mid-write: it never returned, so nothing is lost.
    if (size_ > valid_ && ftruncate(fs_.fd_, static_cast<off_t>(valid_)) != 0)
      throw StoreError(sysError("truncate", fs_.path_));
    if (const int e = pwriteAll(fs_.fd_, frame.data(), frame.size(), static_cast<off_t>(valid_))) {
      errno = e;
      const std::string msg = sysError("write", fs_.path_);
      // Leave no torn frame behind for readers to skip: cut what this write put there.
      if (ftruncate(fs_.fd_, static_cast<off_t>(valid_)) != 0) {
      }
      throw StoreError(msg);
    }
    valid_ += frame.size();
    size_ = valid_;
    pending_.clear();
    if (static_cast<int64_t>(valid_) >= fs_.options_.compact_bytes && valid_ > 2 * liveBytes())
      compact();
  }

 private:
  size_t liveBytes() const {
    size_t n = kMagicLen + 4;
    for (const auto& [k, v] : data_) n += kRecordHeader + k.size() + v.size();
    return n;
  }

  // The live contents as a new file renamed over the path. Processes see the old log or the
  // new one, whole. A failure (a full disk) only leaves the log long: the write succeeded.
  void compact() {
    std::string out(kMagic, kMagicLen), records;
    for (const auto& [k, v] : data_) putRecord(records, kPut, k, v);
    putU32(out, static_cast<uint32_t>(records.size()));
    out += records;
    AtomicWriteOptions o;
    o.mode = 0600;
    o.durable = false;  // bootstrap state: a process crash must not tear it, a reboot ends it
    try {
      writeFileAtomically(fs_.path_, out, o);
    } catch (const Error&) {
    }
  }

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
    size_ = in.size();
    if (in.size() < kMagicLen) {
      // A new store, or one whose first write was torn.
      if (!in.empty() && std::string(kMagic, in.size()) != in)
        throw StoreError(fmt::format("file store {}: not a ddplaunch store file", fs_.path_));
      return;
    }
    if (in.compare(0, kMagicLen, kOldMagic) == 0)
      throw StoreError(fmt::format(
          "file store {}: written by an older ddplaunch (format 1); remove the file", fs_.path_));
    if (in.compare(0, kMagicLen, kMagic) != 0)
      throw StoreError(fmt::format("file store {}: not a ddplaunch store file", fs_.path_));
    size_t pos = kMagicLen;
    valid_ = pos;
    auto corrupt = [&](size_t at) {
      return StoreError(fmt::format("file store {}: corrupt record at byte {}", fs_.path_, at));
    };
    while (in.size() - pos >= 4) {
      const size_t len = getU32(in, pos);
      if (in.size() - pos - 4 < len) break;  // torn: its writer died mid-write
      const size_t end = pos + 4 + len;
      size_t r = pos + 4;
      while (r < end) {
        if (end - r < kRecordHeader) throw corrupt(r);
        const auto op = static_cast<uint8_t>(in[r]);
        const size_t kl = getU32(in, r + 1), vl = getU32(in, r + 5);
        if (end - r - kRecordHeader < kl || end - r - kRecordHeader - kl < vl) throw corrupt(r);
        std::string key = in.substr(r + kRecordHeader, kl);
        const auto v = in.begin() + static_cast<std::ptrdiff_t>(r + kRecordHeader + kl);
        if (op == kPut)
          data_[key] = Bytes(v, v + static_cast<std::ptrdiff_t>(vl));
        else if (op == kErase)
          data_.erase(key);
        else
          throw corrupt(r);
        r += kRecordHeader + kl + vl;
      }
      pos = end;
      valid_ = pos;
    }
  }

  FileStore& fs_;
  std::lock_guard<std::mutex> lock_;
  std::map<std::string, Bytes> data_;
  std::string pending_;  // records of this write, not yet in the file
  size_t valid_ = 0;     // end of the last complete frame (0: nothing, not even the magic)
  size_t size_ = 0;      // the file's length as read
};

FileStore::FileStore(std::string path, FileStoreOptions options)
    : path_(std::move(path)), options_(options) {
  open();
}

void FileStore::open() {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) throw StoreError(sysError("open", path_));
}

FileStore::~FileStore() {
  if (fd_ >= 0) close(fd_);
}

void FileStore::set(const std::string& key, const Bytes& value) {
  Locked l(*this, true);
  l.put(key, value);
  l.commit();
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  Locked l(*this, true);
  auto it = l.data().find(key);
  int64_t v = addCounter(key, it == l.data().end() ? 0 : parseCounter(key, it->second), delta);
  l.put(key, toBytes(std::to_string(v)));
  l.commit();
  return v;
}

Bytes FileStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Locked l(*this, true);
  auto it = l.data().find(key);
  if (it == l.data().end()) {
    if (!expected.empty()) return expected;
  } else if (it->second != expected) {
    return it->second;
  }
  l.put(key, desired);
  l.commit();
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
  bool existed = l.data().count(key) > 0;
  if (existed) {
    l.erase(key);
    l.commit();
  }
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
  for (size_t i = 0; i < keys.size(); ++i) l.put(keys[i], values[i]);
  l.commit();
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
  auto deadline = Clock::now() + timeout;
  for (;;) {
    // Again on every pass: after a compaction the path names a new file, and a watch follows
    // the file it was added on (the old one's rename-over wakes us: IN_ATTRIB).
    if (inotify_add_watch(ino, path_.c_str(),
                          IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE_SELF) < 0) {
      if (errno != ENOENT) throw StoreError(sysError("inotify_add_watch", path_));
      Locked recreate(*this, false);  // removed under us: the path is the store, open it anew
      continue;
    }
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
