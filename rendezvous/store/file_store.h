#pragma once
// A Store in one file shared by processes on one host (or a shared file system with working
// flock), as c10d's FileStore. Each operation locks the file (flock: shared to read,
// exclusive to write) and reads it whole; that is plenty for bootstrap traffic. Blocked gets
// and waits sleep on inotify events for the file instead of polling it.
//
// Crash safety: the file is a log. A write appends its records; it never rewrites what is
// there, so a process killed mid-write leaves at most a torn last record, which readers ignore
// and the next writer cuts off (the killed call never returned, so nothing it reported is
// lost). When the log outgrows its live contents it is compacted into a new file that is
// renamed over the old one; processes holding the old file notice the swap under the lock
// and reopen the path.
#include <cstdint>
#include <mutex>

#include "rendezvous/store/store.h"

namespace ddpl::rdzv {

struct FileStoreOptions {
  // Compact once the log is this long and more than twice its live contents.
  int64_t compact_bytes = 1 << 20;
};

class FileStore : public Store {
 public:
  // Creates the file if it does not exist. Throws StoreError naming the path on failure.
  explicit FileStore(std::string path, FileStoreOptions options = {});
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Duration timeout) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;

  const std::string& path() const { return path_; }

 private:
  class Locked;  // RAII: process mutex + flock + the parsed file
  // Waits until every key exists, then returns their values (empty when !want_values).
  std::vector<Bytes> waitFor(const std::vector<std::string>& keys, Duration timeout,
                             bool want_values, const char* op);

  // Opens path_ as fd_ (creating it if need be).
  void open();

  std::string path_;
  FileStoreOptions options_;
  int fd_ = -1;
  // flock locks belong to the open file description, which all threads share: the mutex
  // serialises this process's threads, flock serialises processes.
  std::mutex mu_;
};

}  // namespace ddpl::rdzv
