// heteroauto._dp: the planner's dynamic programmes (heteroauto/layer_dp.py, orders_dp.py) on problems
// flattened once. A group's steps under a bound M (layer_dp.group_steps) come from its shape, the arrays
// layer_dp._GroupShape holds; the tables are dense (front, stages behind[, layers placed]) with the rows
// that hold no finite entry skipped and each row's finite columns kept as a range. The semantics are
// layer_dp's: dominance drops are pure optimisations, and under a cap a sum that cannot end below it may
// come back as any value >= cap.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace heteroauto {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kRound = 1e-12;  // layer_dp._ROUND

template <typename T>
std::vector<T> copied(const py::array_t<T, py::array::c_style | py::array::forcecast>& array) {
  return std::vector<T>(array.data(), array.data() + array.size());
}

// One group's steps at one tail cap (layer_dp._GroupShape), and their hi / valid under the last bound asked.
struct Shape {
  int options = 0, pairs = 0, tails = 0;
  std::vector<double> every_fixed, every_weight;  // inner (options), first (options, when has_first), edge (pairs)
  std::vector<uint8_t> every_free;
  bool has_first = false;
  std::vector<double> inner_caps;  // (options, depth)
  int depth = 0;
  std::vector<int64_t> far, near;           // (options, tails): flat index into inner_caps
  std::vector<uint8_t> has_inner, special;  // per option
  std::vector<double> first_caps;           // (options, tails)
  std::vector<double> edge_caps;            // (pairs, tails)
  std::vector<int64_t> option, front, destination, pp;
  std::vector<double> rate, ks;

  double bound = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> hi;      // (pairs, tails)
  std::vector<uint8_t> valid;  // (pairs, tails)

  void at(double m) {
    if (m == bound) return;  // NaN never equals: the first call computes
    bound = m;
    const size_t count = every_fixed.size();
    std::vector<double> every(count, kInf);
    if (m != kInf) {
      for (size_t i = 0; i < count; ++i) {
        const double room = m - every_fixed[i];
        double value = std::floor(room / every_weight[i] * (1 + kRound) + kRound);
        if (every_free[i]) value = kInf;
        if (room < -std::abs(m) * kRound) value = -1.0;
        every[i] = value;
      }
    }
    std::vector<double> limited(inner_caps.size()), running(inner_caps.size(), 0.0);
    for (int o = 0; o < options; ++o) {
      double total = 0.0;
      for (int d = 0; d < depth; ++d) {
        const size_t at = static_cast<size_t>(o) * depth + d;
        limited[at] = std::min(inner_caps[at], every[o]);
        if (d >= 1) total += limited[at];
        running[at] = d >= 1 ? total : 0.0;
      }
    }
    std::vector<double> inner_hi(static_cast<size_t>(options) * tails);
    std::vector<uint8_t> inner_valid(inner_hi.size());
    for (int o = 0; o < options; ++o) {
      for (int t = 0; t < tails; ++t) {
        const size_t at = static_cast<size_t>(o) * tails + t;
        double held = has_inner[o] ? running[far[at]] - running[near[at]] : 0.0;
        bool fits = !has_inner[o] || limited[far[at]] >= 1;
        if (has_first) {
          const double first = std::min(first_caps[at], every[options + o]);
          held = held + (special[o] ? first : 0.0);
          fits = fits && (!special[o] || first >= 1);
        }
        inner_hi[at] = held;
        inner_valid[at] = fits;
      }
    }
    hi.assign(static_cast<size_t>(pairs) * tails, 0.0);
    valid.assign(hi.size(), 0);
    const size_t edge = count - pairs;
    for (int p = 0; p < pairs; ++p) {
      for (int t = 0; t < tails; ++t) {
        const size_t at = static_cast<size_t>(p) * tails + t, inner = static_cast<size_t>(option[p]) * tails + t;
        const double edge_hi = std::min(edge_caps[at], every[edge + p]);
        hi[at] = inner_hi[inner] + edge_hi;
        valid[at] = inner_valid[inner] && edge_hi >= 1 && hi[at] >= static_cast<double>(pp[p]);
      }
    }
  }
};

// Every shape of the problems that share one cache (layer_dp.OrderedGroups.shared).
class Shapes {
 public:
  int add(py::array_t<double> every_fixed, py::array_t<double> every_weight, py::array_t<uint8_t> every_free,
          bool has_first, py::array_t<double> inner_caps, py::array_t<int64_t> far, py::array_t<int64_t> near,
          py::array_t<uint8_t> has_inner, py::array_t<uint8_t> special, py::array_t<double> first_caps,
          py::array_t<double> edge_caps, py::array_t<int64_t> option, py::array_t<int64_t> front,
          py::array_t<int64_t> destination, py::array_t<int64_t> pp, py::array_t<double> rate, py::array_t<double> ks,
          int tails) {
    auto shape = std::make_unique<Shape>();
    shape->every_fixed = copied<double>(every_fixed);
    shape->every_weight = copied<double>(every_weight);
    shape->every_free = copied<uint8_t>(every_free);
    shape->has_first = has_first;
    shape->inner_caps = copied<double>(inner_caps);
    shape->options = static_cast<int>(has_inner.size());
    shape->depth = shape->options ? static_cast<int>(inner_caps.size() / shape->options) : 0;
    shape->far = copied<int64_t>(far);
    shape->near = copied<int64_t>(near);
    shape->has_inner = copied<uint8_t>(has_inner);
    shape->special = copied<uint8_t>(special);
    shape->first_caps = copied<double>(first_caps);
    shape->edge_caps = copied<double>(edge_caps);
    shape->option = copied<int64_t>(option);
    shape->front = copied<int64_t>(front);
    shape->destination = copied<int64_t>(destination);
    shape->pp = copied<int64_t>(pp);
    shape->rate = copied<double>(rate);
    shape->ks = copied<double>(ks);
    shape->pairs = static_cast<int>(shape->pp.size());
    shape->tails = tails;
    const size_t everything = shape->every_fixed.size();
    if (shape->every_weight.size() != everything || shape->every_free.size() != everything ||
        everything != static_cast<size_t>(shape->options * (has_first ? 2 : 1) + shape->pairs) ||
        shape->edge_caps.size() != static_cast<size_t>(shape->pairs) * tails ||
        shape->far.size() != static_cast<size_t>(shape->options) * tails ||
        (has_first && shape->first_caps.size() != static_cast<size_t>(shape->options) * tails))
      throw std::invalid_argument("heteroauto._dp.Shapes.add: inconsistent shape arrays");
    shapes_.push_back(std::move(shape));
    return static_cast<int>(shapes_.size()) - 1;
  }

  Shape& at(int id, double bound) {
    Shape& shape = *shapes_.at(id);
    shape.at(bound);
    return shape;
  }

  std::pair<py::array_t<double>, py::array_t<bool>> steps(int id, double bound) {
    Shape& shape = at(id, bound);
    py::array_t<double> hi({shape.pairs, shape.tails});
    py::array_t<bool> valid({shape.pairs, shape.tails});
    std::copy(shape.hi.begin(), shape.hi.end(), hi.mutable_data());
    std::copy(shape.valid.begin(), shape.valid.end(), valid.mutable_data());
    return {hi, valid};
  }

 private:
  std::vector<std::unique_ptr<Shape>> shapes_;
};

// ---- most layers per (front, stages behind) ---------------------------------------------------------------
struct MostTable {
  int fronts = 0, depth = 0;
  std::vector<double> most;

  MostTable(int f, int d) : fronts(f), depth(d), most(static_cast<size_t>(f) * d, -kInf) {}
  bool reachable() const {
    return std::any_of(most.begin(), most.end(), [](double v) { return v > -kInf; });
  }
  double best() const { return *std::max_element(most.begin(), most.end()); }
  void merge(const MostTable& other) {
    for (size_t i = 0; i < most.size(); ++i) most[i] = std::max(most[i], other.most[i]);
  }
  // layer_dp._drop_dominated with np.maximum: an entry a fewer-stages-behind entry matches or beats is cleared
  void drop_dominated() {
    for (int f = 0; f < fronts; ++f) {
      double prior = -kInf;
      for (int t = 0; t < depth; ++t) {
        double& value = most[static_cast<size_t>(f) * depth + t];
        const double kept = value;
        if (prior >= kept) value = -kInf;
        prior = std::max(prior, kept);
      }
    }
  }
};

MostTable place_most(const MostTable& table, const Shape& shape) {
  MostTable result(table.fronts, table.depth);
  for (int p = 0; p < shape.pairs; ++p) {
    const int64_t pp = shape.pp[p];
    const size_t source = static_cast<size_t>(shape.front[p]) * table.depth;
    const size_t target = static_cast<size_t>(shape.destination[p]) * table.depth;
    for (int t = 0; t + pp < table.depth && t < shape.tails; ++t) {
      const double held = table.most[source + t];
      if (held == -kInf || !shape.valid[static_cast<size_t>(p) * shape.tails + t]) continue;
      double& to = result.most[target + t + pp];
      to = std::max(to, held + shape.hi[static_cast<size_t>(p) * shape.tails + t]);
    }
  }
  result.drop_dominated();
  return result;
}

// ---- least sums per (front, stages behind capped, layers placed) -----------------------------------------
struct SumTable {
  int fronts = 0, tails = 0, width = 0;
  std::vector<int> slot;       // per row: its place in sums (-1: all inf, not stored)
  std::vector<double> sums;    // the stored rows, width each
  std::vector<int> low, high;  // per row: its finite columns lie in [low, high] (low > high: none)

  SumTable(int f, int t, int w) : fronts(f), tails(t), width(w), slot(f * t, -1), low(f * t, w), high(f * t, -1) {}
  const double* row(int r) const { return slot[r] < 0 ? nullptr : sums.data() + static_cast<size_t>(slot[r]) * width; }
  double* row(int r) {  // stored (all inf) when it was not
    if (slot[r] < 0) {
      slot[r] = static_cast<int>(sums.size() / width);
      sums.resize(sums.size() + width, kInf);
    }
    return sums.data() + static_cast<size_t>(slot[r]) * width;
  }
  bool reachable() const {
    for (int r = 0; r < fronts * tails; ++r)
      for (int x = low[r]; x <= high[r]; ++x)
        if (row(r)[x] < kInf) return true;
    return false;
  }
  double least_last() const {
    double best = kInf;
    for (int r = 0; r < fronts * tails; ++r)
      if (high[r] == width - 1) best = std::min(best, row(r)[width - 1]);
    return best;
  }
  void merge(const SumTable& other) {
    for (int r = 0; r < fronts * tails; ++r) {
      if (other.low[r] > other.high[r]) continue;
      double* to = row(r);
      const double* from = other.row(r);
      for (int x = other.low[r]; x <= other.high[r]; ++x) to[x] = std::min(to[x], from[x]);
      low[r] = std::min(low[r], other.low[r]);
      high[r] = std::max(high[r], other.high[r]);
    }
  }
  void tighten(int r) {
    const double* values = row(r);
    while (low[r] <= high[r] && values[low[r]] == kInf) ++low[r];
    while (high[r] >= low[r] && values[high[r]] == kInf) --high[r];
    if (low[r] > high[r]) low[r] = width, high[r] = -1;
  }
  // layer_dp._drop_dominated with np.minimum, per front and layer count over the stages behind
  void drop_dominated() {
    std::vector<double> prior(width);
    for (int f = 0; f < fronts; ++f) {
      std::fill(prior.begin(), prior.end(), kInf);
      for (int t = 0; t < tails; ++t) {
        const int r = f * tails + t;
        if (low[r] > high[r]) continue;
        double* values = row(r);
        bool cleared = false;
        for (int x = low[r]; x <= high[r]; ++x) {
          if (prior[x] <= values[x]) {  // a cleared entry was no lower than prior: prior stays the minimum
            values[x] = kInf;
            cleared = true;
          } else {
            prior[x] = values[x];
          }
        }
        if (cleared) tighten(r);
      }
    }
  }
};

// Bounds under a cap: a state is dropped once its sum plus what the layers left add at least cannot end below.
struct Cap {
  double cap = kInf;
  double least_rate = 0.0;
  int layers = 0;
  bool prunes(double sum, int placed) const {
    return cap < kInf && sum + static_cast<double>(layers - placed) * least_rate >= cap * (1 + 1e-12);
  }
};

// One group placed (layer_dp.place_sums of one group): out[y] = min over x in [y - hi, y - pp] of
// in[x] + rate * (y - x) + ks, computed as layer_dp does, min(in[x] - rate * x) + (rate * y + ks).
void place_sum(const SumTable& table, const Shape& shape, const Cap& cap, int tail_cap, SumTable& result) {
  const int width = table.width;
  std::vector<double> shifted(width);
  std::vector<int> window(width);
  for (int p = 0; p < shape.pairs; ++p) {
    const int pp = static_cast<int>(shape.pp[p]);
    const double rate = shape.rate[p], ks = shape.ks[p];
    const int source_front = static_cast<int>(shape.front[p]);
    for (int t = 0; t < table.tails && t < shape.tails; ++t) {
      const int r = source_front * table.tails + t;
      if (table.low[r] > table.high[r] || !shape.valid[static_cast<size_t>(p) * shape.tails + t]) continue;
      const double hi = std::min(shape.hi[static_cast<size_t>(p) * shape.tails + t], static_cast<double>(width - 1));
      const int most = static_cast<int>(hi);
      const double* in = table.row(r);
      const int first = table.low[r], last = table.high[r];
      for (int x = first; x <= last; ++x) shifted[x] = in[x] - rate * static_cast<double>(x);
      const int to = static_cast<int>(shape.destination[p]) * result.tails + std::min(t + pp, tail_cap);
      double* out = nullptr;   // stored on its first finite entry
      int head = 0, tail = 0;  // the deque window[head, tail): indices of increasing shifted values
      const int stop = std::min(width - 1, last + most);
      int lo = width, hi_column = -1;
      for (int y = first + pp; y <= stop; ++y) {
        const int entering = y - pp;
        if (entering <= last && shifted[entering] < kInf) {
          while (tail > head && shifted[window[tail - 1]] >= shifted[entering]) --tail;
          window[tail++] = entering;
        }
        while (tail > head && window[head] < y - most) ++head;
        if (tail == head) continue;
        const double sum = shifted[window[head]] + (rate * static_cast<double>(y) + ks);
        if (cap.prunes(sum, y)) continue;
        if (out == nullptr) out = result.row(to);
        if (sum < out[y]) out[y] = sum;
        lo = std::min(lo, y);
        hi_column = y;
      }
      if (hi_column >= 0) {
        result.low[to] = std::min(result.low[to], lo);
        result.high[to] = std::max(result.high[to], hi_column);
      }
    }
  }
  result.drop_dominated();
}

// A cell of a sum table: front slice, stages behind, layers placed, and its sum.
struct Cell {
  int front, tail, layers;
  double value;
};

// layer_dp._find_source: the first source cell of `table` (pairs in order, then source tails, then the group's
// layers, each ascending) from which one of the shape's steps reproduces the cell's value: the cell becomes it,
// and its pair is returned (-1 when none).
int find_source(const SumTable& table, const Shape& shape, int tail_cap, Cell& cell) {
  const double tolerance = 1e-9 * std::max(1.0, std::abs(cell.value));
  for (int p = 0; p < shape.pairs; ++p) {
    if (shape.destination[p] != cell.front) continue;
    const int pp = static_cast<int>(shape.pp[p]), source_front = static_cast<int>(shape.front[p]);
    const double rate = shape.rate[p], ks = shape.ks[p];
    for (int t = 0; t < table.tails && t < shape.tails; ++t) {
      const size_t at = static_cast<size_t>(p) * shape.tails + t;
      if (std::min(t + pp, tail_cap) != cell.tail || !shape.valid[at]) continue;
      const double* before = table.row(source_front * table.tails + t);
      if (before == nullptr) continue;
      const int most = static_cast<int>(std::min(shape.hi[at], static_cast<double>(cell.layers)));
      for (int layers = pp; layers <= most; ++layers) {
        const double value = before[cell.layers - layers];
        if (std::abs(value + rate * layers + ks - cell.value) <= tolerance) {
          cell = Cell{source_front, t, cell.layers - layers, value};
          return p;
        }
      }
    }
  }
  return -1;
}

SumTable start_sum(int fronts, int tail_cap, int layers) {
  SumTable table(fronts, tail_cap + 1, layers + 1);
  const int first = (fronts - 1) * table.tails;
  table.row(first)[0] = 0.0;
  table.low[first] = table.high[first] = 0;
  return table;
}

// ---- one order (layer_dp.OrderedGroups) ------------------------------------------------------------------
// groups: their shapes at the most stages' tail cap, from the pipeline's end (the order they are placed in);
// the sums read the first tail_cap + 1 tails of each.
class Ordered {
 public:
  Ordered(std::shared_ptr<Shapes> shapes, std::vector<int> groups, int fronts, int tail_cap, int stage_cap, int layers,
          double least_rate)
      : shapes_(std::move(shapes)),
        groups_(std::move(groups)),
        fronts_(fronts),
        tail_cap_(tail_cap),
        stage_cap_(stage_cap),
        layers_(layers),
        least_rate_(least_rate) {}

  double most_layers(double bound) {
    MostTable table(fronts_, stage_cap_ + 1);
    table.most[static_cast<size_t>(fronts_ - 1) * table.depth] = 0.0;
    for (int id : groups_) {
      table = place_most(table, shapes_->at(id, bound));
      if (!table.reachable()) break;
    }
    return table.best();
  }

  double least_sum(double bound, double cap) {
    const std::vector<SumTable> tables = sums(bound, cap, false);
    return tables.back().least_last();
  }

  // layer_dp.rebuild's trace: per group from the pipeline's front, (its step's pair, the stages behind it,
  // its layers) of the least sum, traced back through the tables (the same choices as the numpy trace)
  std::vector<std::tuple<int, int, int>> trace(double bound, double cap) {
    const std::vector<SumTable> tables = sums(bound, cap, true);
    const SumTable& final_table = tables.back();
    if (tables.size() != groups_.size() + 1 || final_table.least_last() == kInf)
      throw std::runtime_error("dynamic programme: nothing fits under the bound");
    Cell cell{0, 0, layers_, kInf};
    for (int r = 0; r < final_table.fronts * final_table.tails; ++r) {
      const double* values = final_table.row(r);
      const double value = values == nullptr ? kInf : values[layers_];
      if (value < cell.value) cell = Cell{r / final_table.tails, r % final_table.tails, layers_, value};
    }
    std::vector<std::tuple<int, int, int>> placed;
    for (int s = static_cast<int>(groups_.size()) - 1; s >= 0; --s) {
      const int layers = cell.layers;
      const int pair = find_source(tables[s], shapes_->at(groups_[s], bound), tail_cap_, cell);
      if (pair < 0) throw std::runtime_error("dynamic programme: no source state reproduces the optimum");
      placed.emplace_back(pair, cell.tail, layers - cell.layers);
    }
    return placed;
  }

 private:
  // the tables after each group from the end (all of them with keep, else the last), stopping once none is reachable
  std::vector<SumTable> sums(double bound, double cap, bool keep) {
    std::vector<SumTable> tables{start_sum(fronts_, tail_cap_, layers_)};
    const Cap limit{cap, least_rate_, layers_};
    for (int id : groups_) {
      SumTable next(fronts_, tail_cap_ + 1, layers_ + 1);
      place_sum(tables.back(), shapes_->at(id, bound), limit, tail_cap_, next);
      const bool reachable = next.reachable();
      if (keep)
        tables.push_back(std::move(next));
      else
        tables.back() = std::move(next);
      if (!reachable) break;
    }
    return tables;
  }

  std::shared_ptr<Shapes> shapes_;
  std::vector<int> groups_;
  int fronts_, tail_cap_, stage_cap_, layers_;
  double least_rate_;
};

// ---- every order (orders_dp.AllOrders): Held-Karp over the sets of types placed from the end -------------
// last[(t * (types + 1) + front + 1) * 2 + starts]: the shape of type t's last group placed before type `front`
// (-1: the pipeline's end); rest[t * 2 + starts]: t's other groups', from its end (shapes as in Ordered).
class AllOrders {
  using Key = std::pair<int, int>;  // (set of types placed, the type in front)

 public:
  AllOrders(std::shared_ptr<Shapes> shapes, int types, std::vector<int> last, std::vector<std::vector<int>> rest,
            int fronts, int tail_cap, int stage_cap, int layers, double least_rate)
      : shapes_(std::move(shapes)),
        types_(types),
        last_(std::move(last)),
        rest_(std::move(rest)),
        fronts_(fronts),
        tail_cap_(tail_cap),
        stage_cap_(stage_cap),
        layers_(layers),
        least_rate_(least_rate) {
    if (last_.size() != static_cast<size_t>(types) * (types + 1) * 2 || rest_.size() != static_cast<size_t>(2 * types))
      throw std::invalid_argument("heteroauto._dp.AllOrders: one last group per (type, front, starts) expected");
  }

  double most_layers(double bound) {
    MostTable start(fronts_, stage_cap_ + 1);
    start.most[static_cast<size_t>(fronts_ - 1) * start.depth] = 0.0;
    auto place = [&](const MostTable& table, int id) { return place_most(table, shapes_->at(id, bound)); };
    auto level = sweep<MostTable>(start, place, nullptr);
    double best = -kInf;
    for (auto& entry : level) best = std::max(best, entry.second.best());
    return best;
  }

  double least_sum(double bound, double cap) {
    double best = kInf;
    for (auto& entry : sum_sweep(bound, cap, nullptr)) best = std::min(best, entry.second.least_last());
    return best;
  }

  // orders_dp.AllOrders.best_order: the types from the pipeline's front of an order whose least sum under M is
  // the least, traced back through the sweep's tables (the same choices as the numpy trace)
  std::vector<int> best_order(double bound, double cap) {
    std::map<Key, std::vector<SumTable>> kept;
    const auto level = sum_sweep(bound, cap, &kept);
    const int full = (1 << types_) - 1;
    int front = -1;
    double least = kInf;
    for (int t = 0; t < types_; ++t) {
      auto found = level.find({full, t});
      if (found != level.end() && found->second.least_last() < least) least = found->second.least_last(), front = t;
    }
    if (front < 0) throw std::runtime_error("orders dynamic programme: nothing fits under the bound");
    const SumTable& final_table = level.at({full, front});
    Cell cell{0, 0, layers_, kInf};
    for (int r = 0; r < final_table.fronts * final_table.tails; ++r) {
      const double* values = final_table.row(r);
      const double value = values == nullptr ? kInf : values[layers_];
      if (value < cell.value) cell = Cell{r / final_table.tails, r % final_table.tails, layers_, value};
    }
    const SumTable start = start_sum(fronts_, tail_cap_, layers_);
    std::vector<int> order;
    int mask = full;
    while (mask) {
      order.push_back(front);
      const std::vector<SumTable>& stages = kept.at({mask, front});
      const std::vector<int>& rest = rest_[static_cast<size_t>(front) * 2 + (mask == full)];
      for (int i = static_cast<int>(stages.size()) - 2; i >= 0; --i)
        if (find_source(stages[i], shapes_->at(rest[i], bound), tail_cap_, cell) < 0)
          throw std::runtime_error("orders dynamic programme: a type's groups do not reproduce the optimum");
      const bool starts = mask == full;
      mask ^= 1 << front;
      bool traced = false;
      for (int source = mask ? 0 : -1; source < (mask ? types_ : 0) && !traced; ++source) {
        if (source >= 0 && !(mask >> source & 1)) continue;
        const SumTable* table = &start;
        if (source >= 0) {
          auto found = kept.find({mask, source});
          if (found == kept.end()) continue;
          table = &found->second.back();
        }
        const int id = last_[(static_cast<size_t>(front) * (types_ + 1) + source + 1) * 2 + starts];
        if (find_source(*table, shapes_->at(id, bound), tail_cap_, cell) >= 0) traced = true, front = source;
      }
      if (!traced) throw std::runtime_error("orders dynamic programme: no type reproduces the optimum");
    }
    return order;
  }

 private:
  std::map<Key, SumTable> sum_sweep(double bound, double cap, std::map<Key, std::vector<SumTable>>* kept) {
    const Cap limit{cap, least_rate_, layers_};
    auto place = [&](const SumTable& table, int id) {
      SumTable result(fronts_, tail_cap_ + 1, layers_ + 1);
      place_sum(table, shapes_->at(id, bound), limit, tail_cap_, result);
      return result;
    };
    return sweep<SumTable>(start_sum(fronts_, tail_cap_, layers_), place, kept);
  }

  // orders_dp.AllOrders._sweep: the tables after every (set, front type), by set size; kept (when given): per
  // (set, type) the type's tables after its last group (merged over the types in front) and after each other one
  template <typename Table, typename Place>
  std::map<Key, Table> sweep(const Table& start, Place place, std::map<Key, std::vector<Table>>* kept) {
    const int full = (1 << types_) - 1;
    std::map<Key, Table> level;
    level.emplace(Key{0, -1}, start);
    for (int step = 0; step < types_; ++step) {
      std::map<Key, Table> partial;
      for (auto& [key, table] : level) {
        const auto [mask, front] = key;
        if (!table.reachable()) continue;
        for (int t = 0; t < types_; ++t) {
          if (mask >> t & 1) continue;
          const int placed = mask | 1 << t;
          Table after = place(table, last_[(static_cast<size_t>(t) * (types_ + 1) + front + 1) * 2 + (placed == full)]);
          auto found = partial.find({placed, t});
          if (found == partial.end())
            partial.emplace(Key{placed, t}, std::move(after));
          else
            found->second.merge(after);
        }
      }
      std::map<Key, Table> next;
      for (auto& [key, table] : partial) {
        Table current = std::move(table);
        std::vector<Table>* stages = kept ? &(*kept)[key] : nullptr;
        for (int id : rest_[static_cast<size_t>(key.second) * 2 + (key.first == full)]) {
          if (!current.reachable()) break;
          Table after = place(current, id);
          if (stages) stages->push_back(std::move(current));
          current = std::move(after);
        }
        if (stages) stages->push_back(current);
        next.emplace(key, std::move(current));
      }
      level = std::move(next);
    }
    return level;
  }

  std::shared_ptr<Shapes> shapes_;
  int types_;
  std::vector<int> last_;
  std::vector<std::vector<int>> rest_;
  int fronts_, tail_cap_, stage_cap_, layers_;
  double least_rate_;
};

// layer_dp.candidates_of_pairs: every A * k + KW (k = 1..layers) of the (A, KW) rows, sorted, each once.
py::array_t<double> candidates(const py::array_t<double, py::array::c_style | py::array::forcecast>& pairs,
                               int layers) {
  if (pairs.ndim() != 2 || pairs.shape(1) != 2) throw std::invalid_argument("candidates: (A, KW) rows expected");
  std::vector<std::pair<double, double>> kinds;
  for (py::ssize_t i = 0; i < pairs.shape(0); ++i) kinds.emplace_back(pairs.at(i, 0), pairs.at(i, 1));
  std::sort(kinds.begin(), kinds.end());
  kinds.erase(std::unique(kinds.begin(), kinds.end()), kinds.end());
  std::vector<double> values;
  values.reserve(kinds.size() * std::max(layers, 0));
  for (const auto& [weight, fixed] : kinds)
    for (int k = 1; k <= layers; ++k) values.push_back(fixed + weight * static_cast<double>(k));
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  py::array_t<double> result(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), result.mutable_data());
  return result;
}

}  // namespace
}  // namespace heteroauto

PYBIND11_MODULE(_dp, m) {
  using namespace heteroauto;
  m.doc() = "The planner's dynamic programmes (heteroauto.layer_dp, heteroauto.orders_dp) in C++.";
  m.def("candidates", &candidates, py::arg("pairs"), py::arg("layers"),
        "Every A * k + KW (k = 1..layers) of the (A, KW) rows, sorted, each once (layer_dp.candidates_of_pairs)");
  py::class_<Shapes, std::shared_ptr<Shapes>>(m, "Shapes")
      .def(py::init<>())
      .def("add", &Shapes::add, py::arg("every_fixed"), py::arg("every_weight"), py::arg("every_free"),
           py::arg("has_first"), py::arg("inner_caps"), py::arg("far"), py::arg("near"), py::arg("has_inner"),
           py::arg("special"), py::arg("first_caps"), py::arg("edge_caps"), py::arg("option"), py::arg("front"),
           py::arg("destination"), py::arg("pp"), py::arg("rate"), py::arg("ks"), py::arg("tails"))
      .def("steps", &Shapes::steps, "(hi, valid) of a shape's steps under a bound, as layer_dp.group_steps");
  py::class_<Ordered>(m, "Ordered")
      .def(py::init<std::shared_ptr<Shapes>, std::vector<int>, int, int, int, int, double>(), py::arg("shapes"),
           py::arg("groups"), py::arg("fronts"), py::arg("tail_cap"), py::arg("stage_cap"), py::arg("layers"),
           py::arg("least_rate"))
      .def("most_layers", &Ordered::most_layers, py::arg("bound"))
      .def("least_sum", &Ordered::least_sum, py::arg("bound"), py::arg("cap"))
      .def("trace", &Ordered::trace, py::arg("bound"), py::arg("cap"));
  py::class_<AllOrders>(m, "AllOrders")
      .def(py::init<std::shared_ptr<Shapes>, int, std::vector<int>, std::vector<std::vector<int>>, int, int, int, int,
                    double>(),
           py::arg("shapes"), py::arg("types"), py::arg("last"), py::arg("rest"), py::arg("fronts"),
           py::arg("tail_cap"), py::arg("stage_cap"), py::arg("layers"), py::arg("least_rate"))
      .def("most_layers", &AllOrders::most_layers, py::arg("bound"))
      .def("least_sum", &AllOrders::least_sum, py::arg("bound"), py::arg("cap"))
      .def("best_order", &AllOrders::best_order, py::arg("bound"), py::arg("cap"));
}
