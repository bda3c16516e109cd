#pragma once
// What launch never shows of a secret, wherever it shows text it did not write: the run
// manifest (launcher/doctor/manifest.h), the live view's last lines, the dashboard's pages.
// docs/doctor.md says the rules to users:
// - the value of a variable whose name, in any case, contains TOKEN (not TOKENS or TOKENIZER),
//   SECRET, PASSWORD, PASSWD,
//   PASSPHRASE, CREDENTIAL, AUTH, KEY, COOKIE or PRIVATE, or has PAT, PWD, PW, PASS, CRED, CREDS
//   as a whole word between '_', '-' or '.' (GITHUB_PAT, DB_PWD; not PATH or PWD itself);
// - the password of any URL with one (scheme://user:password@host), in any value.
// Pure functions of their input, linear in its length (tests/fuzz/fuzz_mask.cc).
#include <string>
#include <vector>

#include "common/environment.h"

namespace ddpl {

inline constexpr const char* kMasked = "<masked>";

Environment maskEnvironment(const Environment& env);
// The same rules for a command line: `--db-password X`, `--api-key=X` and URL passwords.
std::vector<std::string> maskCommandLine(const std::vector<std::string>& args);
// The same rules for free text (a log line, a stack dump with its process's command line),
// word by word on each line: `--api-key=X`, `--password X`, `DB_PASSWORD=X`, URL passwords.
std::string maskSecretsInText(const std::string& text);
// scheme://user:password@host -> scheme://user:<masked>@host, anywhere in `text`.
std::string maskUrlPasswords(const std::string& text);

}  // namespace ddpl
