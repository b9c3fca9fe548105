/* A node's /metrics/resource body read against its template, in one pass of C.

   The pure-Python template path (kcms/sources/decode_template.py, kcms/sources/kubelet_decode.py
   _from_template) was 57 % of `kcms standalone`'s CPU in a 50-node cluster at rest (py-spy, 27 Nov
   2026): splitting the body into ~870 bytes objects, hashing them as a tuple, reading the numbers.
   This does the same checks on the body's bytes without making an object per token; what it
   returns is exactly what the Python path computes (tests/test_decode_template.py runs every
   test with each and compares both with the full decoder, on random and mutated bodies). None
   means the body's constant part is not the template's (the full decode follows); False means a
   number it does not read (a refusal, a spelling, a size), and the caller reads the body in
   Python, which decides: so this never accepts what that path refuses.

   Tokens are those of body.replace(b"\n", b" \n").split(b" "): a blank ends a token, a newline
   ends one and starts the next. The constant part of a body is the body without the bytes of
   its variable tokens. layout() walks a template body's tokens once and keeps the lengths of the
   constant runs between its variable tokens, and their hash (segment_hash); read() then takes
   each run of a new body by its length, hashes it, and cuts the token after it up to the next
   blank or newline, without walking the other ~440 tokens. Where no variable token starts a line
   (layout() refuses other templates), each follows a blank or is the first, and the runs hash the
   same exactly when the Python path's check holds: as many tokens, the same constant tokens
   (tests/test_bodyscan.py checks both ways against a reference).

   Kinds of a variable token (in text order):
     0 another family's number: must read as float() reads it; nothing returned
     1 a container's CPU seconds   -> integer nanoseconds (exact decimal, half-even)
     2 a container CPU timestamp   -> float seconds (the ms integer / 1000.0)
     3 a container's memory bytes  -> round(float) (an int)
     4 any other timestamp         -> checked only
     5 the node's CPU seconds      -> nanoseconds, 6 its timestamp -> seconds, 7 its memory -> int
   Numbers: only [0-9.eE+-], finite and >= 0 for kinds 1, 3, 5, 7; timestamps: 1 to 18 digits,
   no leading zero. CPU seconds are taken here without a sign and below 10**9 s (10**18 ns); other
   spellings ("+1", "-0") and larger counters are left to the Python path. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_NUMBER 64 /* longer tokens are left to the Python path */

enum { K_OTHER, K_CPU, K_CPU_TS, K_MEM, K_TS, K_NODE_CPU, K_NODE_TS, K_NODE_MEM, K_COUNT };

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int
is_number_char(unsigned char c)
{
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
}

/* float(token), as Python reads it: 0 on success. A decimal of at most 15 significant digits
   times 10**e with |e| <= 22 is read exactly: both are exact doubles and one multiplication or
   division rounds correctly, to the value float() gives (Clinger's fast path; "5.3180416e+08",
   the kubelet's spelling of large values, is one). Anything else goes through CPython's own
   reader. */
static int
read_double(const char *s, Py_ssize_t n, double *out)
{
    if (n <= 0 || n >= MAX_NUMBER)
        return -1;
    uint64_t mantissa = 0;
    int digits = 0, any_digit = 0, frac = 0, point = 0, simple = 1;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= '0' && c <= '9') {
            any_digit = 1;
            if (digits || c != '0')
                digits++;
            mantissa = mantissa * 10 + (uint64_t)(c - '0');
            if (point)
                frac++;
        }
        else if (c == '.' && !point)
            point = 1;
        else
            break;
    }
    int exp = 0;
    if (i < n) {
        /* an exponent: e, an optional sign, 1 to 3 digits */
        Py_ssize_t j = i + 1;
        int negative = 0;
        if (s[i] != 'e' && s[i] != 'E')
            simple = 0;
        else {
            if (j < n && (s[j] == '+' || s[j] == '-'))
                negative = s[j++] == '-';
            if (j == n || n - j > 3)
                simple = 0;
            for (; j < n && simple; j++) {
                if (s[j] < '0' || s[j] > '9')
                    simple = 0;
                else
                    exp = exp * 10 + (s[j] - '0');
            }
            if (negative)
                exp = -exp;
        }
    }
    int e = exp - frac;
    if (simple && any_digit && digits <= 15 && e >= -22 && e <= 22) {
        *out = e >= 0 ? (double)mantissa * POW10[e] : (double)mantissa / POW10[-e];
        return 0;
    }
    for (i = 0; i < n; i++)
        if (!is_number_char((unsigned char)s[i]))
            return -1;
    char buf[MAX_NUMBER];
    memcpy(buf, s, (size_t)n);
    buf[n] = '\0';
    double v = PyOS_string_to_double(buf, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return 0;
}

/* A timestamp: 1 to 18 digits, no leading zero. */
static int
read_stamp(const char *s, Py_ssize_t n, int64_t *out)
{
    if (n <= 0 || n > 18 || s[0] == '0')
        return -1;
    int64_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

/* Seconds (digits, an optional point, an optional exponent; no sign) -> integer nanoseconds,
   rounded half to even, exactly as the decimal product: 0 on success, -1 when the token is in
   another spelling or the result is past 10**18 ns (the Python path reads those). */
static int
read_ns(const char *s, Py_ssize_t n, int64_t *out)
{
    char dig[MAX_NUMBER]; /* the significant digits, leading zeros dropped */
    int nd = 0, seen_point = 0, frac = 0, mantissa_digits = 0;
    Py_ssize_t i = 0;
    if (n <= 0 || n >= MAX_NUMBER)
        return -1;
    for (; i < n; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') {
            mantissa_digits++;
            if (seen_point)
                frac++;
            if (nd || c != '0')
                dig[nd++] = c;
        }
        else if (c == '.' && !seen_point)
            seen_point = 1;
        else
            break;
    }
    if (mantissa_digits == 0)
        return -1;
    int exp = 0;
    if (i < n) {
        if (s[i] != 'e' && s[i] != 'E')
            return -1;
        i++;
        int negative = 0;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            negative = s[i++] == '-';
        if (i == n || n - i > 4)
            return -1;
        for (; i < n; i++) {
            if (s[i] < '0' || s[i] > '9')
                return -1;
            exp = exp * 10 + (s[i] - '0');
        }
        if (negative)
            exp = -exp;
    }
    /* value = dig * 10**(exp - frac); in ns, dig * 10**shift */
    int shift = exp - frac + 9;
    int keep = nd + shift; /* digits of the integer part of the result */
    if (nd == 0 || keep < 0) {
        *out = 0; /* zero, or below half a nanosecond: the first dropped digit is a 0 */
        return 0;
    }
    if (keep > 18)
        return -1;
    int64_t ns = 0;
    for (int k = 0; k < keep; k++)
        ns = ns * 10 + (k < nd ? dig[k] - '0' : 0);
    if (keep < nd) {
        int first = dig[keep] - '0', rest = 0;
        for (int k = keep + 1; k < nd; k++)
            rest |= dig[k] != '0';
        if (first > 5 || (first == 5 && (rest || (ns & 1))))
            ns++;
    }
    *out = ns;
    return 0;
}

static int
parse_common(PyObject *args, const char **body, Py_ssize_t *len, Py_ssize_t *ntok, Py_buffer *positions)
{
    PyObject *b;
    if (!PyArg_ParseTuple(args, "Sny*", &b, ntok, positions))
        return -1;
    if (positions->len % sizeof(uint32_t)) {
        PyBuffer_Release(positions);
        PyErr_SetString(PyExc_ValueError, "positions: an array of uint32");
        return -1;
    }
    *body = PyBytes_AS_STRING(b);
    *len = PyBytes_GET_SIZE(b);
    return 0;
}

/* Word-at-a-time test for a blank or a newline among 8 bytes: most of a body's bytes are inside
   tokens, so the walk below looks at single bytes only in words that hold a delimiter (~22 against
   ~9 us for a 32 kB body, 27 Nov). */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
#define BLANKS (ONES * (uint64_t)' ')
#define NEWLINES (ONES * (uint64_t)'\n')

/* The high bit of each of the 8 bytes at p that may be a blank or a newline: exact for the lowest
   one (a borrow runs only upwards), which is all token_end reads of it. */
static inline uint64_t
delimiter_bits(const char *p)
{
    uint64_t w, a, b;
    memcpy(&w, p, sizeof w);
    a = w ^ BLANKS;
    b = w ^ NEWLINES;
    return (((a - ONES) & ~a) | ((b - ONES) & ~b)) & HIGHS;
}

static inline int
has_delimiter(const char *p)
{
    return delimiter_bits(p) != 0;
}

/* One delimiter of the walk below: token `tok` is body[start:i], a blank (c) or a newline at i
   ends it (the end of the body counts as a blank at len). -1 when the walk must stop: more than
   ntok tokens, or positions that do not ascend. */
struct walk {
    Py_ssize_t tok, start, next, want;
};

static inline int
walk_delimiter(struct walk *w, Py_ssize_t i, char c, Py_ssize_t ntok, const uint32_t *pos, Py_ssize_t npos,
               Py_ssize_t *starts, Py_ssize_t *ends)
{
    if (w->tok == w->want) {
        starts[w->next] = w->start;
        ends[w->next] = i;
        w->next++;
        if (w->next < npos) {
            if ((Py_ssize_t)pos[w->next] <= w->want)
                return -1; /* positions must ascend */
            w->want = (Py_ssize_t)pos[w->next];
        }
        else
            w->want = -1;
    }
    w->tok++;
    if (w->tok > ntok)
        return -1;
    w->start = c == ' ' ? i + 1 : i;
    return 0;
}

/* Walk a template body's tokens: each variable token's span into starts/ends. 0 when the body
   has exactly ntok tokens and the positions ascend and are all within it. Where SSE2 is (every
   x86-64), 16 bytes are compared at once and each delimiter found from the mask; elsewhere, 8 at
   a time (has_delimiter). Only layout() walks tokens: a template's next bodies are read by their
   segments' lengths (walk_segments). */
static int
cut(const char *body, Py_ssize_t len, Py_ssize_t ntok, const uint32_t *pos, Py_ssize_t npos, Py_ssize_t *starts,
    Py_ssize_t *ends)
{
    struct walk w = {0, 0, 0, npos ? (Py_ssize_t)pos[0] : -1};
    Py_ssize_t i = 0;
#ifdef __SSE2__
    const __m128i blanks = _mm_set1_epi8(' '), newlines = _mm_set1_epi8('\n');
    for (; i + 16 <= len; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(body + i));
        unsigned mask = (unsigned)_mm_movemask_epi8(
            _mm_or_si128(_mm_cmpeq_epi8(v, blanks), _mm_cmpeq_epi8(v, newlines)));
        while (mask) {
            Py_ssize_t at = i + __builtin_ctz(mask);
            mask &= mask - 1;
            if (walk_delimiter(&w, at, body[at], ntok, pos, npos, starts, ends) < 0)
                return -1;
        }
    }
#endif
    for (;;) {
        while (i + 8 <= len && !has_delimiter(body + i))
            i += 8;
        char c = i < len ? body[i] : ' ';
        if (c != ' ' && c != '\n') {
            i++;
            continue;
        }
        if (walk_delimiter(&w, i, c, ntok, pos, npos, starts, ends) < 0)
            return -1;
        if (i >= len)
            break;
        i++;
    }
    return w.tok == ntok && w.next == npos ? 0 : -1;
}

/* The hash of a body's constant part: the bytes between its variable tokens, segment by segment.
   Ours, because of what it replaced: copying the constant part into a bytes object and taking
   Python's hash() of it (SipHash-1-3), plus walking every token to find the variable ones, was
   ~175 000 instructions of a scrape's ~910 000 (callgrind, 1 Dec); this is two loads, two xors
   and a 64 x 64 -> 128-bit multiplication a 16 bytes. It is keyed (from Python's own hash key, so
   PYTHONHASHSEED fixes it too) against accidental collisions only: a kubelet that made one could
   only have its own numbers read with the labels of its own last body, which it can send anyway
   (see kcms/sources/decode_template.py). */
static uint64_t hash_key[2];

static inline uint64_t
fold(uint64_t a, uint64_t b)
{
#ifdef __SIZEOF_INT128__
    __uint128_t product = (__uint128_t)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
#else
    uint64_t a_lo = (uint32_t)a, a_hi = a >> 32, b_lo = (uint32_t)b, b_hi = b >> 32;
    uint64_t lo = a_lo * b_lo, mid1 = a_hi * b_lo, mid2 = a_lo * b_hi, hi = a_hi * b_hi;
    uint64_t carry = ((lo >> 32) + (uint32_t)mid1 + (uint32_t)mid2) >> 32;
    return (lo + (mid1 << 32) + (mid2 << 32)) ^ (hi + (mid1 >> 32) + (mid2 >> 32) + carry);
#endif
}

static inline uint64_t
load8(const char *p)
{
    uint64_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

static inline uint64_t
load4(const char *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

/* h with the n bytes at p folded in; the caller fixes n (the template's segment length), so the
   overlapping reads of the last 1 to 16 bytes cover them all and tell every content apart */
static inline uint64_t
segment_hash(uint64_t h, const char *p, Py_ssize_t n)
{
    for (; n > 16; p += 16, n -= 16)
        h = fold(load8(p) ^ hash_key[0], load8(p + 8) ^ h);
    uint64_t a = 0, b = 0;
    if (n >= 8) {
        a = load8(p);
        b = load8(p + n - 8);
    }
    else if (n >= 4) {
        a = load4(p);
        b = load4(p + n - 4);
    }
    else if (n > 0)
        a = (uint64_t)(unsigned char)p[0] << 16 | (uint64_t)(unsigned char)p[n >> 1] << 8 | (unsigned char)p[n - 1];
    return fold(a ^ hash_key[1] ^ (uint64_t)n, b ^ h);
}

/* Where the token at `at` ends: the first blank or newline from there, or len. A word at a time:
   on a little-endian machine the lowest bit of delimiter_bits gives the offset (a number token,
   ~15 bytes, in two words; byte by byte, the walk below was 29 000 of a scrape's 827 000
   instructions, callgrind, 1 Dec). */
static inline Py_ssize_t
token_end(const char *body, Py_ssize_t at, Py_ssize_t len)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; at + 8 <= len; at += 8) {
        uint64_t found = delimiter_bits(body + at);
        if (found)
            return at + (__builtin_ctzll(found) >> 3);
    }
#endif
    while (at < len && body[at] != ' ' && body[at] != '\n')
        at++;
    return at;
}

/* A body read by its template's segment lengths: segment k (the constant bytes before variable
   token k; the last one, those after the last token) is hashed, then the token runs to the next
   blank or newline. -1 when the lengths do not fit the body. A body whose segments hash to the
   template's is the template's constant part with other tokens in the variable places: layout()
   takes only templates whose variable tokens do not start a line, so each follows a blank (or is
   the first), and a token found this way is that token of body.replace(b"\n", b" \n").split(b" "),
   as the Python path cuts it. */
static int
walk_segments(const char *body, Py_ssize_t len, const uint16_t *seg, Py_ssize_t npos, Py_ssize_t *starts,
              Py_ssize_t *ends, uint64_t *hash)
{
    uint64_t h = hash_key[1];
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < npos; k++) {
        if (seg[k] > len - at)
            return -1;
        h = segment_hash(h, body + at, seg[k]);
        at += seg[k];
        starts[k] = at;
        at = token_end(body, at, len);
        ends[k] = at;
    }
    if (len - at != seg[npos])
        return -1;
    *hash = segment_hash(h, body + at, seg[npos]);
    return 0;
}

PyDoc_STRVAR(layout_doc,
             "layout(body, ntok, positions) -> (segments, hash) | None\n\n"
             "What read() needs of a template body: the lengths of the constant runs around the tokens\n"
             "at positions (uint32, ascending), as uint16 bytes (one more than positions), and their\n"
             "hash. None when body does not have exactly ntok tokens, a run is 64 KiB or longer, or a\n"
             "variable token starts a line.");

static PyObject *
layout(PyObject *self, PyObject *args)
{
    const char *body;
    Py_ssize_t len, ntok;
    Py_buffer positions;
    if (parse_common(args, &body, &len, &ntok, &positions) < 0)
        return NULL;
    PyObject *result = NULL, *segments = NULL;
    Py_ssize_t npos = positions.len / (Py_ssize_t)sizeof(uint32_t);
    Py_ssize_t *starts = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(npos ? 2 * npos : 1));
    if (starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t *ends = starts + npos;
    if (cut(body, len, ntok, (const uint32_t *)positions.buf, npos, starts, ends) < 0)
        goto misfit;
    segments = PyBytes_FromStringAndSize(NULL, (npos + 1) * (Py_ssize_t)sizeof(uint16_t));
    if (segments == NULL)
        goto done;
    uint16_t *seg = (uint16_t *)PyBytes_AS_STRING(segments);
    Py_ssize_t from = 0;
    for (Py_ssize_t k = 0; k <= npos; k++) {
        Py_ssize_t to = k < npos ? starts[k] : len;
        if (to - from > UINT16_MAX)
            goto misfit;
        seg[k] = (uint16_t)(to - from);
        from = k < npos ? ends[k] : len;
    }
    /* Read by its runs only where they cut the tokens the walk above cut. Where a variable token
       starts a line, walk_segments ends it at its newline, where it begins: from there it cuts
       a byte or more before the token walk (each token it cuts ends at the first delimiter, no
       later than that walk's), and the last run does not fit the body's end. (starts and ends
       have served: the walk overwrites them.) */
    uint64_t h;
    if (walk_segments(body, len, seg, npos, starts, ends, &h) < 0)
        goto misfit;
    result = Py_BuildValue("OK", segments, (unsigned long long)h);
    goto done;
misfit:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(segments);
    PyMem_Free(starts);
    PyBuffer_Release(&positions);
    return result;
}

PyDoc_STRVAR(read_doc,
             "read(body, segments, kinds, hash) -> (cpu_ns, cpu_times, memory, node, bounds) | None | False\n\n"
             "The numbers of body read as its template's (segments and hash from layout(), kinds one\n"
             "byte per variable token; see the module's source); None when body is not the template's\n"
             "constant part with other tokens in the variable places; False when a number is not one\n"
             "it reads (the Python reader decides).\n"
             "cpu_ns, cpu_times and memory are lists in text order (cpu_times empty without\n"
             "timestamps); node is [cpu_ns, seconds or None, memory bytes] or None; bounds is\n"
             "(min, max) of cpu_ns, then of memory, then of cpu_times, each None for an empty list\n"
             "(what the screening would take min() and max() of).");

static PyObject *
read_body(PyObject *self, PyObject *args)
{
    PyObject *b;
    Py_buffer segments, kinds;
    PyObject *want;
    if (!PyArg_ParseTuple(args, "Sy*y*O!", &b, &segments, &kinds, &PyLong_Type, &want))
        return NULL;
    unsigned long long want_hash = PyLong_AsUnsignedLongLong(want); /* layout()'s, in range */
    PyObject *result = NULL, *cpu = NULL, *times = NULL, *mem = NULL, *node = NULL, *bounds = NULL;
    Py_ssize_t *starts = NULL, *ends = NULL;
    Py_ssize_t npos = kinds.len;
    if (want_hash == (unsigned long long)-1 && PyErr_Occurred())
        goto done;
    if (segments.len != (npos + 1) * (Py_ssize_t)sizeof(uint16_t)) {
        PyErr_SetString(PyExc_ValueError, "segments and kinds: one uint16 and one byte per variable token, and a uint16 more");
        goto done;
    }
    starts = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(npos ? 2 * npos : 1));
    if (starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    ends = starts + npos;
    const char *body = PyBytes_AS_STRING(b);
    uint64_t h;
    if (walk_segments(body, PyBytes_GET_SIZE(b), (const uint16_t *)segments.buf, npos, starts, ends, &h) < 0 ||
        h != (uint64_t)want_hash) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* the lists at their final sizes, filled in place (no append, no regrowth) */
    const unsigned char *kind = kinds.buf;
    Py_ssize_t count[K_COUNT] = {0}, filled[K_COUNT] = {0};
    for (Py_ssize_t k = 0; k < npos; k++)
        if (kind[k] < K_COUNT)
            count[kind[k]]++;
    cpu = PyList_New(count[K_CPU]);
    times = PyList_New(count[K_CPU_TS]);
    mem = PyList_New(count[K_MEM]);
    if (cpu == NULL || times == NULL || mem == NULL)
        goto done;
    int64_t node_ns = -1, node_ts = -1;
    double node_mem = -1.0;
    /* each column's least and greatest value, as read (rounding and the ms -> s division keep the
       order): the screening's min() and max() over the lists were ~45 000 instructions a scrape,
       5 % of one (callgrind, 1 Dec) */
    int64_t cpu_lo = INT64_MAX, cpu_hi = INT64_MIN, ts_lo = INT64_MAX, ts_hi = INT64_MIN, stamp_ms = 0;
    PyObject *stamp_obj = NULL;
    double mem_lo = INFINITY, mem_hi = -INFINITY;
    for (Py_ssize_t k = 0; k < npos; k++) {
        const char *s = body + starts[k];
        Py_ssize_t n = ends[k] - starts[k];
        PyObject *item = NULL, *into = NULL;
        int into_kind = 0;
        double v;
        int64_t i64;
        switch (kind[k]) {
        case K_OTHER:
            if (read_double(s, n, &v) < 0)
                goto refuse;
            continue;
        case K_CPU:
        case K_NODE_CPU:
            /* Exact nanoseconds. What read_ns accepts (digits, one point, an exponent of at most
               4 digits, no sign, below 10**9 s) float() reads too, so the Python path's float
               check holds without a read_double (~30 % of this loop's instructions, callgrind). */
            if (read_ns(s, n, &i64) < 0)
                goto refuse;
            if (kind[k] == K_NODE_CPU) {
                node_ns = i64;
                continue;
            }
            item = PyLong_FromLongLong(i64);
            into = cpu;
            into_kind = K_CPU;
            cpu_lo = i64 < cpu_lo ? i64 : cpu_lo;
            cpu_hi = i64 > cpu_hi ? i64 : cpu_hi;
            break;
        case K_CPU_TS:
        case K_TS:
        case K_NODE_TS:
            if (read_stamp(s, n, &i64) < 0)
                goto refuse;
            if (kind[k] == K_NODE_TS)
                node_ts = i64;
            if (kind[k] != K_CPU_TS)
                continue;
            /* a kubelet stamps a scrape's containers alike: one float for a run of equal stamps
               (59 objects fewer a scrape of 60 containers, made and freed) */
            if (stamp_obj != NULL && i64 == stamp_ms)
                item = Py_NewRef(stamp_obj);
            else {
                item = PyFloat_FromDouble((double)i64 / 1000.0);
                stamp_ms = i64;
                stamp_obj = item; /* borrowed: the list holds it */
            }
            into = times;
            into_kind = K_CPU_TS;
            ts_lo = i64 < ts_lo ? i64 : ts_lo;
            ts_hi = i64 > ts_hi ? i64 : ts_hi;
            break;
        case K_MEM:
        case K_NODE_MEM:
            if (read_double(s, n, &v) < 0 || !(v >= 0.0 && v < INFINITY))
                goto refuse;
            if (kind[k] == K_NODE_MEM) {
                node_mem = v;
                continue;
            }
            item = PyLong_FromDouble(nearbyint(v)); /* round(): half to even, the default mode */
            into = mem;
            into_kind = K_MEM;
            mem_lo = v < mem_lo ? v : mem_lo;
            mem_hi = v > mem_hi ? v : mem_hi;
            break;
        default:
            PyErr_SetString(PyExc_ValueError, "kinds: unknown kind");
            goto done;
        }
        if (item == NULL)
            goto done;
        PyList_SET_ITEM(into, filled[into_kind]++, item); /* steals the reference */
    }
    if (node_ns >= 0 || node_mem >= 0.0) {
        if (node_ns < 0 || node_mem < 0.0) {
            PyErr_SetString(PyExc_ValueError, "kinds: the node's CPU and memory come together");
            goto done;
        }
        PyObject *ts = node_ts >= 0 ? PyFloat_FromDouble((double)node_ts / 1000.0) : Py_NewRef(Py_None);
        PyObject *m = PyLong_FromDouble(nearbyint(node_mem));
        node = (ts && m) ? Py_BuildValue("[LOO]", (long long)node_ns, ts, m) : NULL;
        Py_XDECREF(ts);
        Py_XDECREF(m);
        if (node == NULL)
            goto done;
    }
    else
        node = Py_NewRef(Py_None);
    /* Numbers only, and never changed after: no reference cycle can pass through these lists,
       so the cyclic collector need not visit them. Tracked, the store's three lists of each
       scrape were walked by every young collection until
       the cycle's freeze: gen-0 passes of 5-40 ms and gen-1 passes of 55-135 ms during a
       5000-node cycle (gc.callbacks, 28 Nov). */
    PyObject_GC_UnTrack(cpu);
    PyObject_GC_UnTrack(times);
    PyObject_GC_UnTrack(mem);
    /* (min, max) of cpu_ns, of memory and of cpu_times, None where a list is empty */
    PyObject *part[6];
    part[0] = count[K_CPU] ? PyLong_FromLongLong(cpu_lo) : Py_NewRef(Py_None);
    part[1] = count[K_CPU] ? PyLong_FromLongLong(cpu_hi) : Py_NewRef(Py_None);
    part[2] = count[K_MEM] ? PyLong_FromDouble(nearbyint(mem_lo)) : Py_NewRef(Py_None);
    part[3] = count[K_MEM] ? PyLong_FromDouble(nearbyint(mem_hi)) : Py_NewRef(Py_None);
    part[4] = count[K_CPU_TS] ? PyFloat_FromDouble((double)ts_lo / 1000.0) : Py_NewRef(Py_None);
    part[5] = count[K_CPU_TS] ? PyFloat_FromDouble((double)ts_hi / 1000.0) : Py_NewRef(Py_None);
    if (part[0] && part[1] && part[2] && part[3] && part[4] && part[5])
        bounds = PyTuple_Pack(6, part[0], part[1], part[2], part[3], part[4], part[5]);
    for (int i = 0; i < 6; i++)
        Py_XDECREF(part[i]);
    if (bounds == NULL)
        goto done;
    result = PyTuple_Pack(5, cpu, times, mem, node, bounds);
    goto done;
refuse:
    result = Py_NewRef(Py_False);
done:
    Py_XDECREF(cpu);
    Py_XDECREF(times);
    Py_XDECREF(mem);
    Py_XDECREF(node);
    Py_XDECREF(bounds);
    PyMem_Free(starts);
    PyBuffer_Release(&segments);
    PyBuffer_Release(&kinds);
    return result;
}

static PyMethodDef methods[] = {
    {"layout", layout, METH_VARARGS, layout_doc},
    {"read", read_body, METH_VARARGS, read_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kcms.sources._bodyscan",
    "A node's /metrics/resource body read against its template (see _bodyscan.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__bodyscan(void)
{
    /* the segments' hash key, from Python's own (random per process unless PYTHONHASHSEED) */
    static const char *const seeds[2] = {"kcms.sources._bodyscan key 0", "kcms.sources._bodyscan key 1"};
    for (int i = 0; i < 2; i++) {
        PyObject *seed = PyBytes_FromString(seeds[i]);
        Py_hash_t h = seed == NULL ? -1 : PyObject_Hash(seed);
        Py_XDECREF(seed);
        if (h == -1)
            return NULL;
        hash_key[i] = (uint64_t)h;
    }
    return PyModule_Create(&module);
}
