"""One field naming style across the product's C++: data members are snake_case.

Every data member a class, struct or union declares in common/, rendezvous/, launcher/,
worker/, web/ and examples/ (headers and sources, nested and function-local types included) is
named `lower_case` (a class's private members end in `_`, as `options_`), or, for a static or
constant member, `kConstant`. A camelCase member (`worldSize`, `bucketBytes_`) fails the test,
which names its file and line. Functions and methods are not data members: they keep their
camelCase names, as do the fields of LibTorch's, c10d's, Gloo's and MPI's own types, which the
product reads but does not declare.

The scanner reads C++ text without a compiler: comments, string and character literals and
preprocessor lines are blanked out; braces are followed so that a statement directly inside a
`class`/`struct`/`union` body is a member declaration; one with a parameter list is a function,
anything else declares data (`T a = 1, b{2};`, `T c[4];`, `T d : 3;`, `void (*e)(int);`).

Usage: field_naming_test.py [ROOT]  (CTest runs it on this tree; standard library only.
`field_naming_test.py --list ROOT` prints the camelCase members of another tree, e.g. an older
commit's, and exits 1 when there are any.)"""
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRODUCT = ("common", "rendezvous", "launcher", "worker", "web", "examples")
SOURCES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".h.in")

SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
CONSTANT = re.compile(r"^k[A-Z][A-Za-z0-9]*$")
IDENT = re.compile(r"[A-Za-z_]\w*")
TYPE_HEAD = re.compile(r"(?:^|[\s>])(class|struct|union)\b")
ENUM_HEAD = re.compile(r"\benum\b")
NOT_DATA = re.compile(r"^\s*(using|typedef|friend|static_assert|template|enum|namespace|"
                      r"class|struct|union|operator)\b")
ACCESS = re.compile(r"^\s*(public|protected|private)\s*:(?!:)")


def blank(text):
    """The text with comments, literals and preprocessor lines replaced by spaces (newlines
    kept, so that offsets still give line numbers)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#" or (line_start and c in " \t" and
                                       text[i:].lstrip(" \t").startswith("#")):
            # A preprocessor line, with its continuations.
            j = i
            while j < n:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                if k > 0 and text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        if text.startswith("//", i):
            k = text.find("\n", i)
            k = n if k < 0 else k
            out.append(" " * (k - i))
            i = k
            continue
        if text.startswith("/*", i):
            k = text.find("*/", i + 2)
            k = n if k < 0 else k + 2
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:i + 20])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + m.group(1) + '"', i)
            k = n if end < 0 else end + len(m.group(1)) + 2
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:k - 1]) + '"')
            i = k
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
            continue
        out.append(c)
        line_start = c == "\n" or (line_start and c in " \t")
        i += 1
    return "".join(out)


def strip_angles(s):
    """`std::map<std::string, std::vector<int>> m` -> `std::map m` (template argument lists
    out, so that their commas and parentheses say nothing)."""
    out, depth = [], 0
    i = 0
    while i < len(s):
        c = s[i]
        if c == "<" and not s.startswith("<<", i) and (depth or re.search(r"[\w\s]$", s[:i])):
            depth += 1
        elif c == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(c)
        i += 1
    return "".join(out) if depth == 0 else s


def top_level(s, stop):
    """The part of s before the first of the characters `stop` outside () [] {}."""
    depth = 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c in stop:
            return s[:i]
    return s


def split_top(s, sep=","):
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c == sep:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return parts


def data_members(statement):
    """The names of the data members one member declaration declares ([] for a function, a
    type, an alias...) and whether they are static or constant."""
    s = ACCESS.sub("", statement).strip()
    while ACCESS.match(s):
        s = ACCESS.sub("", s).strip()
    if "{type}" in s:
        # `struct X { ... } a, b;`, `enum class K { ... } k = K::kA;`: what follows the body.
        s = "T " + s.rsplit("{type}", 1)[1].strip()
        if s == "T ":
            return [], False
    s = re.sub(r"\[\[.*?\]\]", " ", s)
    s = re.sub(r"\balignas\s*\([^)]*\)", " ", s)
    if not s or NOT_DATA.match(s):
        return [], False
    constant = re.search(r"\b(static|constexpr|const)\b", top_level(strip_angles(s), "=")) is not None
    s = strip_angles(s)
    names = []
    pieces = split_top(s)
    for k, piece in enumerate(pieces):
        decl = top_level(piece, "={").strip()
        decl = re.sub(r"\s*(?<!:):(?!:)\s*[\w\s+*()]+$", "", decl)  # a bit-field's width
        pointer = re.search(r"\(\s*[*&]+\s*(\w+)\s*\)\s*\(", decl)  # void (*f)(int)
        if pointer:
            names.append(pointer.group(1))
            continue
        if "(" in decl or "operator" in decl:
            if k == 0:
                return [], False  # a function or constructor: `T f(...)`, `explicit X(...)`
            continue
        decl = re.sub(r"\[[^\]]*\]", "", decl).strip()  # arrays
        words = IDENT.findall(decl)
        if not words or (k == 0 and len(words) < 2):
            if k == 0:
                return [], False  # `X;`, a macro or a lone name: declares nothing we can see
            continue
        names.append(words[-1])
    return names, constant


def members(text):
    """[(line, name, constant)] for every data member declared in the C++ text."""
    code = blank(text)
    found = []
    # Per open brace: (is it a class/struct/union body?, the statement text before the brace,
    # where that statement began).
    stack = [(False, "", 0)]
    stmt_start = 0  # where the rest of the statement being read begins
    head = ""       # the statement's text before stmt_start, nested brace contents elided
    head_pos = 0    # where the statement began
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "{":
            text_before = head + code[stmt_start:i]
            flat = strip_angles(text_before)
            is_type = (TYPE_HEAD.search(flat) is not None and not ENUM_HEAD.search(flat)
                       and "(" not in flat.split(":")[0] and "=" not in flat)
            is_enum = ENUM_HEAD.search(flat) is not None and "=" not in flat
            stack.append((is_type or is_enum, text_before, head_pos if head else stmt_start))
            head, stmt_start, head_pos = "", i + 1, i + 1
            i += 1
            continue
        if c == "}":
            was_type, text_before, pos = stack.pop() if len(stack) > 1 else (False, "", 0)
            stmt_start = i + 1
            head, head_pos = "", i + 1
            if stack[-1][0]:
                # Back in a class body: the braces were an initializer, an inline function's
                # body, a nested type's or enum's body, or a lambda's.
                flat = strip_angles(text_before)
                j = i + 1
                while j < n and code[j].isspace():
                    j += 1
                ends = j < n and code[j] not in ";,=)" and (
                    "(" in top_level(flat, "=") or not flat.strip())
                if was_type or not ends:
                    head = text_before + (" {type} " if was_type else "{}")
                    head_pos = pos
            i += 1
            continue
        if c == ";":
            if stack[-1][0]:
                statement = head + code[stmt_start:i]
                begin = head_pos if head else stmt_start
                begin += len(code[begin:i]) - len(code[begin:i].lstrip())
                names, constant = data_members(re.sub(r"\s+", " ", statement))
                for name in names:
                    found.append((code.count("\n", 0, begin) + 1, name, constant))
            head, stmt_start, head_pos = "", i + 1, i + 1
        elif c == ":" and stack[-1][0] and code[i - 1] != ":" and code[i + 1:i + 2] != ":":
            if re.fullmatch(r"\s*(public|protected|private)\s*", head + code[stmt_start:i]):
                head, stmt_start, head_pos = "", i + 1, i + 1
        i += 1
    return found


def badly_named(name, constant):
    return not (SNAKE.match(name) or (constant and CONSTANT.match(name)))


def scan(root=ROOT):
    """['path:line: name', ...] for every camelCase data member of the product folders."""
    out = []
    for top in PRODUCT:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(d, name)
                with open(path, errors="replace") as f:
                    text = f.read()
                for line, member, constant in members(text):
                    if badly_named(member, constant):
                        out.append(f"{os.path.relpath(path, root)}:{line}: {member}")
    return out


class TheTree(unittest.TestCase):
    def test_every_data_member_is_snake_case(self):
        found = scan()
        self.assertEqual(found, [], f"\n{len(found)} camelCase data member(s); name them "
                         "snake_case (members_ of a class end in _):\n" + "\n".join(found))


def names(text):
    return [name for _, name, _ in members(text)]


class TheScanner(unittest.TestCase):
    """The scanner itself, on made-up code: members are found, everything else is not."""

    def test_fields_and_private_members_are_found(self):
        text = """
        struct Options {
          int worldSize = 1;   // int notMe;
          std::map<std::string, std::vector<int>> byName, otherMap;
          std::function<void(int, char)> onDone = [](int, char) { int localVar = 0; };
          std::chrono::milliseconds storeTimeout{30000};
          char nameBuf[16];
          unsigned flagBits : 3;
          void (*callBack)(int);
          std::string text = "int inString;";
        };
        class Thing {
         public:
          explicit Thing(int x) : bucketBytes_(x) {}
          int bucketBytes() const { return bucketBytes_; }
          void run(int argCount);
          static constexpr int kMaxCount = 3;
         private:
          int bucketBytes_;
          std::unique_ptr<Impl> impl_;
        };"""
        self.assertEqual(names(text), ["worldSize", "byName", "otherMap", "onDone", "storeTimeout",
                                       "nameBuf", "flagBits", "callBack", "text", "kMaxCount",
                                       "bucketBytes_", "impl_"])

    def test_nested_and_function_local_types_are_scanned(self):
        text = """
        namespace a { namespace {
        struct Outer {
          struct Inner { int innerField; } inner;
          enum class Kind { kA, kB } kind = Kind::kA;
        };
        int f(int someArg) {
          struct Local { int localField; };
          int notAMember = someArg;
          return notAMember;
        }
        } }"""
        self.assertEqual(names(text), ["innerField", "inner", "kind", "localField"])

    def test_functions_aliases_and_friends_are_not_data(self):
        text = """
        template <class T> struct Box {
          using valueType = T;
          friend bool operator==(const Box&, const Box&) = default;
          template <class U> U castTo() const;
          Box() = default;
          ~Box();
          Box& operator=(const Box& other);
          virtual int sizeOf(int a, int b) const override = 0;
          std::vector<T> items() { return {}; }
          T value_;
        };"""
        self.assertEqual(names(text), ["value_"])

    def test_camel_case_fails_snake_case_and_constants_pass(self):
        self.assertTrue(badly_named("worldSize", False))
        self.assertTrue(badly_named("bucketBytes_", False))
        self.assertTrue(badly_named("kMaxCount", False))  # a constant's name on a plain field
        self.assertFalse(badly_named("world_size", False))
        self.assertFalse(badly_named("bucket_bytes_", False))
        self.assertFalse(badly_named("kMaxCount", True))
        self.assertEqual(members("struct S {\n  static constexpr int kMax = 2;\n};"),
                         [(2, "kMax", True)])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--list":
        found = scan(os.path.abspath(sys.argv[2]))
        print("\n".join(found))
        sys.exit(1 if found else 0)
    # Exit 77 when a test was skipped (SKIP_RETURN_CODE): never counted as passed.
    sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
    import python_test_main  # noqa: E402
    python_test_main.main()
