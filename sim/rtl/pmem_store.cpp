// pmem_store -- the sparse line store behind sim/rtl/pmem_media.sv, and its bulk backdoor.
//
// Contract:
// - One store per pmem_media instance, named by the instance's hierarchical path without a
//   leading "TOP." (e.g. "tcxl_harness.media0"), the path cocotb gives the same instance.
//   A store is created on first use by either side: cocotb tests start before the RTL's
//   initial blocks run, so the backdoor may touch a store before pmem_media opened it.
// - Lines are 64 bytes (byte 0 = bits 7:0 of the RTL's 512-bit line) plus a poison bit, zero
//   until written. Memory is held in pages of 1024 lines allocated on the first write that
//   is not all zero, so a simulated device of any capacity costs only the pages it touched.
// - RTL side (DPI-C imports of pmem_media): pmem_store_open, pmem_store_read (one line and
//   its poison), pmem_store_write (strobed bytes; poison set, cleared or kept).
// - Backdoor side (extern "C", reached from Python by ctypes.CDLL(None): the simulator is
//   linked with -rdynamic, sim/runner.py): tcxl_pmem_store, tcxl_pmem_read / _write (whole
//   arrays of consecutive lines), tcxl_pmem_depth, tcxl_pmem_pages. They take effect at once,
//   with no clock edge (sim/bfm/pmem.py states what that means for in-flight writes).
// - Line numbers are checked against the depth pmem_media opened the store with (0 = not
//   opened yet: not checked); a bad range returns -1 and touches nothing.
// - Not thread-safe: Verilator calls the imports from its evaluation thread, Python from the
//   same thread between evaluations.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "svdpi.h"

namespace {

constexpr uint64_t kLineBytes = 64;
constexpr unsigned kPageShift = 10;
constexpr uint64_t kPageLines = uint64_t{1} << kPageShift;

struct Page {
    uint8_t data[kPageLines * kLineBytes];
    uint8_t poison[kPageLines];
};

const Page& zero_page() {
    static const Page* page = new Page();   // value-initialised: all zero
    return *page;
}

struct Store {
    uint64_t depth = 0;                    // lines; 0 until pmem_media opened the store
    std::unordered_map<uint64_t, std::unique_ptr<Page>> pages;
    uint64_t last_no = ~uint64_t{0};       // one-entry lookup cache: the RTL reads every edge
    Page* last = nullptr;

    const Page& read_page(uint64_t no) {
        if (no == last_no) return *last;
        auto it = pages.find(no);
        if (it == pages.end()) return zero_page();
        last_no = no;
        last = it->second.get();
        return *last;
    }

    Page& write_page(uint64_t no) {
        if (no == last_no) return *last;
        std::unique_ptr<Page>& slot = pages[no];
        if (!slot) slot.reset(new Page());
        last_no = no;
        last = slot.get();
        return *last;
    }

    bool in_range(uint64_t first, uint64_t count) const {
        return depth == 0 || (first <= depth && count <= depth - first);
    }
};

std::string key_of(const char* name) {
    std::string key(name ? name : "");
    if (key.compare(0, 4, "TOP.") == 0) key.erase(0, 4);
    return key;
}

Store* find_or_create(const char* name) {
    static std::map<std::string, std::unique_ptr<Store>> registry;
    std::unique_ptr<Store>& slot = registry[key_of(name)];
    if (!slot) slot.reset(new Store());
    return slot.get();
}

// f(page number, line in page, lines done before this span, lines in span) for the spans of
// first..first+count-1 that stay inside one page each, in order.
template <typename F>
void for_each_span(uint64_t first, uint64_t count, F f) {
    for (uint64_t done = 0; done < count;) {
        const uint64_t ln = first + done;
        const uint64_t i = ln & (kPageLines - 1);
        const uint64_t n = std::min(count - done, kPageLines - i);
        f(ln >> kPageShift, i, done, n);
        done += n;
    }
}

bool all_zero(const uint8_t* p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

}  // namespace

// ------------------------------------------------------------------ DPI-C (pmem_media.sv)
extern "C" void* pmem_store_open(const char* name, long long depth_lines) {
    Store* s = find_or_create(name);
    s->depth = static_cast<uint64_t>(depth_lines);
    return s;
}

// The line into `data` (16 x 32 bits, word 0 = bits 31:0); returns its poison bit.
extern "C" svBit pmem_store_read(void* store, long long line, svBitVecVal* data) {
    Store* s = static_cast<Store*>(store);
    const uint64_t ln = static_cast<uint64_t>(line);
    const Page& p = s->read_page(ln >> kPageShift);
    const uint64_t i = ln & (kPageLines - 1);
    std::memcpy(data, p.data + i * kLineBytes, kLineBytes);   // little-endian host
    return p.poison[i];
}

// Bytes b with strb[b] set take data's byte b; poison: set, else cleared, else kept.
extern "C" void pmem_store_write(void* store, long long line, const svBitVecVal* data,
                                 const svBitVecVal* strb, svBit set_poison, svBit clear_poison) {
    Store* s = static_cast<Store*>(store);
    const uint64_t ln = static_cast<uint64_t>(line);
    Page& p = s->write_page(ln >> kPageShift);
    const uint64_t i = ln & (kPageLines - 1);
    const uint8_t* src = reinterpret_cast<const uint8_t*>(data);
    uint8_t* dst = p.data + i * kLineBytes;
    for (unsigned b = 0; b < kLineBytes; b++)
        if ((strb[b / 32] >> (b % 32)) & 1) dst[b] = src[b];
    if (set_poison) p.poison[i] = 1;
    else if (clear_poison) p.poison[i] = 0;
}

// ------------------------------------------------------------------ backdoor (ctypes)
extern "C" __attribute__((visibility("default"))) void* tcxl_pmem_store(const char* name) {
    return find_or_create(name);
}

extern "C" __attribute__((visibility("default"))) uint64_t tcxl_pmem_depth(void* store) {
    return static_cast<Store*>(store)->depth;
}

// Pages (1024 lines, 65,600 bytes each) allocated so far.
extern "C" __attribute__((visibility("default"))) uint64_t tcxl_pmem_pages(void* store) {
    return static_cast<Store*>(store)->pages.size();
}

// Lines first..first+count-1 into data (count x 64 bytes) and, unless null, poison (count
// bytes, 0/1).
extern "C" __attribute__((visibility("default")))
int tcxl_pmem_read(void* store, uint64_t first, uint64_t count, uint8_t* data, uint8_t* poison) {
    Store* s = static_cast<Store*>(store);
    if (!s->in_range(first, count)) return -1;
    for_each_span(first, count, [&](uint64_t no, uint64_t i, uint64_t done, uint64_t n) {
        const Page& p = s->read_page(no);
        std::memcpy(data + done * kLineBytes, p.data + i * kLineBytes, n * kLineBytes);
        if (poison) std::memcpy(poison + done, p.poison + i, n);
    });
    return 0;
}

// Lines first..first+count-1 from data; poison from `poison` (count bytes), or cleared when
// it is null. Writing zeros to a page never written allocates nothing.
extern "C" __attribute__((visibility("default")))
int tcxl_pmem_write(void* store, uint64_t first, uint64_t count, const uint8_t* data,
                    const uint8_t* poison) {
    Store* s = static_cast<Store*>(store);
    if (!s->in_range(first, count)) return -1;
    for_each_span(first, count, [&](uint64_t no, uint64_t i, uint64_t done, uint64_t n) {
        const bool absent = no != s->last_no && s->pages.find(no) == s->pages.end();
        if (absent && all_zero(data + done * kLineBytes, n * kLineBytes) && (!poison || all_zero(poison + done, n)))
            return;
        Page& p = s->write_page(no);
        std::memcpy(p.data + i * kLineBytes, data + done * kLineBytes, n * kLineBytes);
        for (uint64_t k = 0; k < n; k++) p.poison[i + k] = poison ? (poison[done + k] != 0) : 0;
    });
    return 0;
}
