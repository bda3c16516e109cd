#include "common/secrets.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string_view>

namespace ddpl {
namespace {

std::string upperCase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

// Words that mark a secret wherever they appear in a name (MY_PASSWD, NETRC_AUTH, HF_TOKEN).
constexpr const char* kSecretParts[] = {"TOKEN",      "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE",
                                        "CREDENTIAL", "AUTH",   "KEY",      "COOKIE", "PRIVATE"};
// Short ones that would hit innocent names as substrings (PAT in PATH, PWD in the shell's own
// PWD): secret only as a whole word between '_', '-' or '.' (GITHUB_PAT, DB_PWD, SMTP_PASS).
constexpr const char* kSecretWords[] = {"PAT", "PWD", "PW", "PASS", "CRED", "CREDS"};

bool secretName(const std::string& name) {
  const std::string upper = upperCase(name);
  if (upper == "PWD" || upper == "OLDPWD") return false;  // the shell's working directories
  for (const char* part : kSecretParts) {
    const size_t len = std::strlen(part);
    for (size_t at = upper.find(part); at != std::string::npos; at = upper.find(part, at + 1)) {
      // Counts of tokens and tokenizers are training settings, not secrets (MAX_TOKENS,
      // TOKENIZERS_PARALLELISM, --tokenizer): a manifest that hid them would hide a change.
      // Looked at in place: a copy of the rest per occurrence made a worker's word of
      // "TOKENS_" repeated cost its length squared.
      const std::string_view after = std::string_view(upper).substr(at + len);
      if (std::strcmp(part, "TOKEN") == 0 &&
          (after.substr(0, 4) == "IZER" || after == "S" || after.substr(0, 2) == "S_" ||
           after.substr(0, 2) == "S-"))
        continue;
      return true;
    }
  }
  size_t start = 0;
  while (start <= upper.size()) {
    size_t end = upper.find_first_of("_-.", start);
    if (end == std::string::npos) end = upper.size();
    const std::string word = upper.substr(start, end - start);
    for (const char* w : kSecretWords)
      if (word == w) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

std::string maskUrlPasswords(const std::string& text) {
  // scheme://user:password@host: the password goes, the rest (which server, which user) stays.
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t scheme = text.find("://", pos);
    if (scheme == std::string::npos) break;
    size_t auth = scheme + 3;
    size_t end = text.find_first_of("/?# \t\n", auth);
    if (end == std::string::npos) end = text.size();
    // The last '@' and the first ':' of the authority, looked for inside it only: a search of
    // the whole text from each "://" made a line of them cost its length squared.
    const std::string_view authority = std::string_view(text).substr(auth, end - auth);
    const size_t at_in = authority.rfind('@');
    const size_t colon_in = authority.find(':');
    if (at_in != std::string_view::npos && colon_in != std::string_view::npos && colon_in < at_in) {
      const size_t colon = auth + colon_in, at = auth + at_in;
      out += text.substr(pos, colon + 1 - pos);
      out += kMasked;
      pos = at;
    } else {
      out += text.substr(pos, auth - pos);
      pos = auth;
    }
  }
  return out + text.substr(pos);
}

Environment maskEnvironment(const Environment& env) {
  Environment out;
  for (const auto& [k, v] : env) out[k] = secretName(k) ? kMasked : maskUrlPasswords(v);
  return out;
}

std::vector<std::string> maskCommandLine(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  bool next_is_secret = false;
  for (const auto& a : args) {
    if (next_is_secret) {
      out.push_back(kMasked);
      next_is_secret = false;
      continue;
    }
    // An option's name: after its dashes, up to '='. A word of dashes only ("----", a
    // separator line a worker prints) names nothing.
    const size_t begin = a.find_first_not_of('-');
    if (a.size() > 2 && a[0] == '-' && begin != std::string::npos) {
      const size_t eq = a.find('=');  // never before `begin`: '=' is not a dash
      const std::string name =
          a.substr(begin, eq == std::string::npos ? std::string::npos : eq - begin);
      if (secretName(name)) {
        if (eq == std::string::npos) {
          out.push_back(a);
          next_is_secret = true;
        } else {
          out.push_back(a.substr(0, eq + 1) + kMasked);
        }
        continue;
      }
    }
    out.push_back(maskUrlPasswords(a));
  }
  return out;
}

std::string maskSecretsInText(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    // Words split on single spaces, so that the spacing comes back as it was.
    std::vector<std::string> words;
    for (size_t a = start;;) {
      size_t b = text.find(' ', a);
      if (b == std::string::npos || b > end) b = end;
      words.push_back(text.substr(a, b - a));
      if (b == end) break;
      a = b + 1;
    }
    words = maskCommandLine(words);
    for (auto& w : words) {
      // NAME=VALUE as an environment shows it (DB_PASSWORD=x in a printed environment).
      const size_t eq = w.find('=');
      if (eq != std::string::npos && eq > 0 && w[0] != '-' && w.substr(eq + 1) != kMasked &&
          secretName(w.substr(0, eq)))
        w = w.substr(0, eq + 1) + kMasked;
    }
    for (size_t i = 0; i < words.size(); ++i) out += (i ? " " : "") + words[i];
    if (end == text.size()) break;
    out += '\n';
    start = end + 1;
  }
  return out;
}

}  // namespace ddpl
