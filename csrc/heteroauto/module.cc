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
#include <cstring>
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

using Doubles = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// One group's options as arrays (per option; caps: (options, distances), by distance from the pipeline's end).
struct OptionArrays {
  std::vector<int64_t> tp, pp;
  std::vector<double> compute, update, first_extra, first_update, last_extra, last_update, inner_send;
  std::vector<double> middle, first, last, both;
  int count = 0, distances = 0;

  const double* caps(bool is_first, bool is_last, int o) const {  // StageVariantCaps.of
    const std::vector<double>& kind = is_first && is_last ? both : is_first ? first : is_last ? last : middle;
    return kind.data() + static_cast<size_t>(o) * distances;
  }
};

// layer_dp._ends: (S extra, update extra) of a stage: embedding if first, head if last, twice its send.
std::pair<double, double> stageEnds(const OptionArrays& options, int o, bool is_first, bool is_last, double send) {
  const double extra = (is_first ? options.first_extra[o] : 0.0) + (is_last ? options.last_extra[o] : 0.0) + 2 * send;
  const double update = (is_first ? options.first_update[o] : 0.0) + (is_last ? options.last_update[o] : 0.0);
  return {extra, update};
}

// layer_dp._shape and _cached_shape: group g's steps at tails 0..tail_cap, made from its options. sends:
// (options, tp slices), the transfer from the option's last stage to a next group at that slice's tp (NaN: the
// next group has no option at that tp); fronts: the tp slices (the last: nothing placed in front).
std::unique_ptr<Shape> makeShape(const OptionArrays& options, const std::vector<int64_t>& tp_values,
                                 const std::vector<double>& sends, bool first_group, bool last_group,
                                 bool monotone_next, bool relaxed, double b_minus_alpha, int tail_cap) {
  auto shape = std::make_unique<Shape>();
  const int count = options.count, tails = tail_cap + 1, slices = static_cast<int>(tp_values.size());
  shape->options = count;
  shape->tails = tails;
  std::vector<double> weight(count), inner_fixed(count), inner_ks(count), first_fixed(count), first_ks(count);
  std::vector<int> far(count), near(count);
  shape->has_first = false;
  for (int o = 0; o < count; ++o) {
    weight[o] = b_minus_alpha * options.compute[o] + options.update[o];
    const int pp = static_cast<int>(options.pp[o]);
    int positions_first = 2, positions_last = pp;  // inner stages at distances 2..pp
    if (first_group && pp >= 2) {
      --positions_last;
      const auto [extra, update] = stageEnds(options, o, true, false, options.inner_send[o]);
      first_fixed[o] = b_minus_alpha * extra + update;
      first_ks[o] = extra;
      shape->has_first = true;
    } else {
      first_fixed[o] = -kInf;
      first_ks[o] = 0.0;
    }
    const int positions = std::max(0, positions_last - positions_first + 1);
    far[o] = positions ? positions_last : 0;
    near[o] = positions ? positions_first : 1;
    inner_fixed[o] = b_minus_alpha * 2 * options.inner_send[o];
    inner_ks[o] = static_cast<double>(positions * 2) * options.inner_send[o];
  }
  auto tail_at = [&](int t) { return relaxed ? 0 : t; };
  std::vector<double> edge_fixed;
  for (int o = 0; o < count; ++o) {
    const bool edge_first = first_group && options.pp[o] == 1;
    const int64_t destination = std::find(tp_values.begin(), tp_values.end(), options.tp[o]) - tp_values.begin();
    for (int front = last_group ? slices : 0; front < (last_group ? slices + 1 : slices); ++front) {
      double send = 0.0;
      if (front < slices) {
        if (monotone_next && options.tp[o] < tp_values[front]) continue;
        send = sends[static_cast<size_t>(o) * slices + front];
        if (std::isnan(send)) continue;  // the next group has no option at that tp
      }
      const bool is_last = front == slices;
      const auto [extra, update] = stageEnds(options, o, edge_first, is_last, send);
      shape->option.push_back(o);
      shape->front.push_back(front);
      shape->destination.push_back(destination);
      shape->pp.push_back(options.pp[o]);
      shape->rate.push_back(options.compute[o]);
      shape->ks.push_back(inner_ks[o] + first_ks[o] + extra);
      const double* caps = options.caps(edge_first, is_last, o);
      for (int t = 0; t < tails; ++t) shape->edge_caps.push_back(caps[tail_at(t) + 1]);
      edge_fixed.push_back(b_minus_alpha * extra + update);
    }
  }
  shape->pairs = static_cast<int>(shape->pp.size());
  // the caps past the farthest inner stage at the deepest tail are never read: the running total stops there
  const int farthest = far.empty() ? 0 : *std::max_element(far.begin(), far.end());
  shape->depth = std::max(2, tail_at(tail_cap) + farthest + 1);
  shape->depth = std::min(shape->depth, options.distances);
  for (int o = 0; o < count; ++o) {
    const double* caps = options.middle.data() + static_cast<size_t>(o) * options.distances;
    shape->inner_caps.insert(shape->inner_caps.end(), caps, caps + shape->depth);
  }
  shape->has_inner.resize(count);
  shape->special.assign(count, 0);
  for (int o = 0; o < count; ++o) {
    shape->has_inner[o] = far[o] > 0;
    shape->special[o] = shape->has_first && std::isfinite(first_fixed[o]);
    for (int t = 0; t < tails; ++t) {
      const int64_t row = static_cast<int64_t>(o) * shape->depth + tail_at(t);
      shape->far.push_back(row + far[o]);
      shape->near.push_back(row + near[o] - 1);
      if (shape->has_first)
        shape->first_caps.push_back(
            first_fixed[o] == -kInf
                ? kInf
                : options.first[static_cast<size_t>(o) * options.distances + tail_at(t) + options.pp[o]]);
    }
  }
  // the allowances of the inner, first and edge stages in one pass (weights <= 0 as 1, marked free)
  auto every = [&](const std::vector<double>& fixed, const std::vector<double>& weights) {
    for (size_t i = 0; i < fixed.size(); ++i) {
      shape->every_fixed.push_back(fixed[i]);
      shape->every_free.push_back(weights[i] <= 0);
      shape->every_weight.push_back(weights[i] <= 0 ? 1.0 : weights[i]);
    }
  };
  every(inner_fixed, weight);
  if (shape->has_first) every(first_fixed, weight);
  std::vector<double> pair_weight;
  for (int64_t o : shape->option) pair_weight.push_back(weight[o]);
  every(edge_fixed, pair_weight);
  return shape;
}

// Every shape of the problems that share one cache (layer_dp.OrderedGroups.shared).
class Shapes {
 public:
  // the options of a group as arrays, once per option list (an id for make)
  int options(Ints tp, Ints pp, Doubles compute, Doubles update, Doubles first_extra, Doubles first_update,
              Doubles last_extra, Doubles last_update, Doubles inner_send, Doubles middle, Doubles first, Doubles last,
              Doubles both) {
    OptionArrays arrays;
    arrays.tp = copied<int64_t>(tp);
    arrays.pp = copied<int64_t>(pp);
    arrays.compute = copied<double>(compute);
    arrays.update = copied<double>(update);
    arrays.first_extra = copied<double>(first_extra);
    arrays.first_update = copied<double>(first_update);
    arrays.last_extra = copied<double>(last_extra);
    arrays.last_update = copied<double>(last_update);
    arrays.inner_send = copied<double>(inner_send);
    arrays.middle = copied<double>(middle);
    arrays.first = copied<double>(first);
    arrays.last = copied<double>(last);
    arrays.both = copied<double>(both);
    arrays.count = static_cast<int>(arrays.tp.size());
    arrays.distances = arrays.count ? static_cast<int>(arrays.middle.size() / arrays.count) : 0;
    for (const std::vector<double>* caps : {&arrays.middle, &arrays.first, &arrays.last, &arrays.both})
      if (caps->size() != static_cast<size_t>(arrays.count) * arrays.distances)
        throw std::invalid_argument("heteroauto._dp.Shapes.options: one row of caps per option expected");
    options_.push_back(std::move(arrays));
    return static_cast<int>(options_.size()) - 1;
  }

  // a group's shape (see make_shape); its id
  int make(int options, const std::vector<int64_t>& tp_values, Doubles sends, bool first_group, bool last_group,
           bool monotone_next, bool relaxed, double b_minus_alpha, int tail_cap) {
    const OptionArrays& arrays = options_.at(options);
    const std::vector<double> send = copied<double>(sends);
    if (send.size() != static_cast<size_t>(arrays.count) * tp_values.size())
      throw std::invalid_argument("heteroauto._dp.Shapes.make: one send per (option, tp slice) expected");
    for (int o = 0; o < arrays.count; ++o) {
      if (arrays.distances <= (relaxed ? 0 : tail_cap) + arrays.pp[o])
        throw std::invalid_argument("heteroauto._dp.Shapes.make: caps shorter than the deepest stage");
      if (std::find(tp_values.begin(), tp_values.end(), arrays.tp[o]) == tp_values.end())
        throw std::invalid_argument("heteroauto._dp.Shapes.make: an option's tp is no tp slice");
    }
    shapes_.push_back(
        makeShape(arrays, tp_values, send, first_group, last_group, monotone_next, relaxed, b_minus_alpha, tail_cap));
    return static_cast<int>(shapes_.size()) - 1;
  }

  // (option, front, destination, pp, rate, ks) per step of a shape, as layer_dp.GroupSteps holds them
  py::tuple pairs(int id) const {
    const Shape& shape = *shapes_.at(id);
    auto ints = [](const std::vector<int64_t>& v) { return py::array_t<int64_t>(v.size(), v.data()); };
    auto doubles = [](const std::vector<double>& v) { return py::array_t<double>(v.size(), v.data()); };
    return py::make_tuple(ints(shape.option), ints(shape.front), ints(shape.destination), ints(shape.pp),
                          doubles(shape.rate), doubles(shape.ks));
  }

  const Shape& get(int id) const { return *shapes_.at(id); }
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
  std::vector<OptionArrays> options_;
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
  void dropDominated() {
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

MostTable placeMost(const MostTable& table, const Shape& shape) {
  MostTable result(table.fronts, table.depth);
  std::vector<std::vector<int>> held(table.fronts);  // per front, the stages behind with a finite entry
  for (int f = 0; f < table.fronts; ++f)
    for (int t = 0; t < table.depth; ++t)
      if (table.most[static_cast<size_t>(f) * table.depth + t] > -kInf) held[f].push_back(t);
  for (int p = 0; p < shape.pairs; ++p) {
    const int64_t pp = shape.pp[p];
    const size_t source = static_cast<size_t>(shape.front[p]) * table.depth;
    const size_t target = static_cast<size_t>(shape.destination[p]) * table.depth;
    for (int t : held[shape.front[p]]) {
      if (t + pp >= table.depth || t >= shape.tails) break;
      if (!shape.valid[static_cast<size_t>(p) * shape.tails + t]) continue;
      double& to = result.most[target + t + pp];
      to = std::max(to, table.most[source + t] + shape.hi[static_cast<size_t>(p) * shape.tails + t]);
    }
  }
  result.dropDominated();
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
  double leastLast() const {
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
  // every entry outside layer counts first..last cleared
  void keepColumns(int first, int last) {
    for (int r = 0; r < fronts * tails; ++r) {
      if (low[r] > high[r]) continue;
      double* values = row(r);
      for (int x = low[r]; x <= high[r] && x < first; ++x) values[x] = kInf;
      for (int x = std::max(low[r], last + 1); x <= high[r]; ++x) values[x] = kInf;
      tighten(r);
    }
  }
  // layer_dp._drop_dominated with np.minimum, per front and layer count over the stages behind
  void dropDominated() {
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
// rest (when given): per layer count placed, a lower bound on what the groups still to place add (else the layers
// left at least_rate); the margin leaves room for rounding.
struct Cap {
  double cap = kInf;
  double least_rate = 0.0;
  int layers = 0;
  const std::vector<double>* rest = nullptr;
  bool prunes(double sum, int placed) const {
    if (cap == kInf) return false;
    const double ahead = rest ? (*rest)[placed] : static_cast<double>(layers - placed) * least_rate;
    return sum + ahead >= cap * (1 + 1e-12);
  }
};

// orders_dp._least_fill: per layer count placed y, the least sum of rate * layers over groups holding layers - y
// layers in all, one to room layers each (inf where no such split exists): one layer each, the rest to the
// cheapest first.
std::vector<double> leastFill(std::vector<std::pair<double, double>> groups, int layers) {  // (rate, room)
  std::vector<double> result(layers + 1, kInf);
  for (const auto& group : groups)
    if (!(group.second >= 1)) return result;
  std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double base = 0.0, spare_room = 0.0;
  for (const auto& [rate, room] : groups) base += rate, spare_room += room - 1;
  const int count = static_cast<int>(groups.size());
  for (int y = 0; y <= layers; ++y) {
    const double spare = static_cast<double>(layers - y - count);
    if (spare < 0 || spare > spare_room) continue;
    double total = base, left = spare;
    for (const auto& [rate, room] : groups) {
      if (left <= 0) break;
      const double taken = std::min(left, room - 1);
      total += taken * rate;
      left -= taken;
    }
    result[y] = total;
  }
  return result;
}

// One group placed (layer_dp.place_sums of one group): out[y] = min over x in [y - hi, y - pp] of
// in[x] + rate * (y - x) + ks, computed as layer_dp does, min(in[x] - rate * x) + (rate * y + ks).
void placeSum(const SumTable& table, const Shape& shape, const Cap& cap, int tail_cap, SumTable& result) {
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
  result.dropDominated();
}

// A cell of a sum table: front slice, stages behind, layers placed, and its sum.
struct Cell {
  int front, tail, layers;
  double value;
};

// layer_dp._find_source: the first source cell of `table` (pairs in order, then source tails, then the group's
// layers, each ascending) from which one of the shape's steps reproduces the cell's value: the cell becomes it,
// and its pair is returned (-1 when none).
int findSource(const SumTable& table, const Shape& shape, int tail_cap, Cell& cell) {
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

SumTable startSum(int fronts, int tail_cap, int layers) {
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

  double mostLayers(double bound) {
    MostTable table(fronts_, stage_cap_ + 1);
    table.most[static_cast<size_t>(fronts_ - 1) * table.depth] = 0.0;
    for (int id : groups_) {
      table = placeMost(table, shapes_->at(id, bound));
      if (!table.reachable()) break;
    }
    return table.best();
  }

  double leastSum(double bound, double cap) {
    const std::vector<SumTable> tables = sums(bound, cap, false);
    return tables.back().leastLast();
  }

  // layer_dp.rebuild's trace: per group from the pipeline's front, (its step's pair, the stages behind it,
  // its layers) of the least sum, traced back through the tables (the same choices as the numpy trace)
  std::vector<std::tuple<int, int, int>> trace(double bound, double cap) {
    const std::vector<SumTable> tables = sums(bound, cap, true);
    const SumTable& final_table = tables.back();
    if (tables.size() != groups_.size() + 1 || final_table.leastLast() == kInf)
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
      const int pair = findSource(tables[s], shapes_->at(groups_[s], bound), tail_cap_, cell);
      if (pair < 0) throw std::runtime_error("dynamic programme: no source state reproduces the optimum");
      placed.emplace_back(pair, cell.tail, layers - cell.layers);
    }
    return placed;
  }

 private:
  // the tables after each group from the end (all of them with keep, else the last), stopping once none is reachable
  std::vector<SumTable> sums(double bound, double cap, bool keep) {
    std::vector<SumTable> tables{startSum(fronts_, tail_cap_, layers_)};
    const Cap limit{cap, least_rate_, layers_};
    for (int id : groups_) {
      SumTable next(fronts_, tail_cap_ + 1, layers_ + 1);
      placeSum(tables.back(), shapes_->at(id, bound), limit, tail_cap_, next);
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
    // per type, per group (pipeline order), the least time of a layer in any of its steps
    least_rates_.resize(types);
    for (int t = 0; t < types; ++t) {
      const int count = groupsOf(t);
      least_rates_[t].assign(count, kInf);
      auto take = [&](int g, int id) {
        for (double rate : shapes_->get(id).rate) least_rates_[t][g] = std::min(least_rates_[t][g], rate);
      };
      for (int starts = 0; starts < 2; ++starts) {
        const std::vector<int>& rest = rest_[static_cast<size_t>(t) * 2 + starts];
        for (size_t i = 0; i < rest.size(); ++i) take(count - 2 - static_cast<int>(i), rest[i]);
        for (int front = -1; front < types; ++front)
          if (front != t) take(count - 1, last_[(static_cast<size_t>(t) * (types + 1) + front + 1) * 2 + starts]);
      }
    }
  }

  double mostLayers(double bound) {
    MostTable start(fronts_, stage_cap_ + 1);
    start.most[static_cast<size_t>(fronts_ - 1) * start.depth] = 0.0;
    auto place = [&](const MostTable& table, int id, int, int, int) {
      return placeMost(table, shapes_->at(id, bound));
    };
    auto level = sweep<MostTable>(start, place, nullptr, [](int, int, MostTable&) {});
    double best = -kInf;
    for (auto& entry : level) best = std::max(best, entry.second.best());
    return best;
  }

  double leastSum(double bound, double cap) {
    double best = kInf;
    for (auto& entry : sumSweep(bound, cap, nullptr)) best = std::min(best, entry.second.leastLast());
    return best;
  }

  // orders_dp.AllOrders.best_order: the types from the pipeline's front of an order whose least sum under M is
  // the least, traced back through the sweep's tables (the same choices as the numpy trace)
  std::vector<int> bestOrder(double bound, double cap) {
    std::map<Key, std::vector<SumTable>> kept;
    const auto level = sumSweep(bound, cap, &kept);
    const int full = (1 << types_) - 1;
    int front = -1;
    double least = kInf;
    for (int t = 0; t < types_; ++t) {
      auto found = level.find({full, t});
      if (found != level.end() && found->second.leastLast() < least) least = found->second.leastLast(), front = t;
    }
    if (front < 0) throw std::runtime_error("orders dynamic programme: nothing fits under the bound");
    const SumTable& final_table = level.at({full, front});
    Cell cell{0, 0, layers_, kInf};
    for (int r = 0; r < final_table.fronts * final_table.tails; ++r) {
      const double* values = final_table.row(r);
      const double value = values == nullptr ? kInf : values[layers_];
      if (value < cell.value) cell = Cell{r / final_table.tails, r % final_table.tails, layers_, value};
    }
    const SumTable start = startSum(fronts_, tail_cap_, layers_);
    std::vector<int> order;
    int mask = full;
    while (mask) {
      order.push_back(front);
      const std::vector<SumTable>& stages = kept.at({mask, front});
      const std::vector<int>& rest = rest_[static_cast<size_t>(front) * 2 + (mask == full)];
      for (int i = static_cast<int>(stages.size()) - 2; i >= 0; --i)
        if (findSource(stages[i], shapes_->at(rest[i], bound), tail_cap_, cell) < 0)
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
        if (findSource(*table, shapes_->at(id, bound), tail_cap_, cell) >= 0) traced = true, front = source;
      }
      if (!traced) throw std::runtime_error("orders dynamic programme: no type reproduces the optimum");
    }
    return order;
  }

 private:
  std::map<Key, SumTable> sumSweep(double bound, double cap, std::map<Key, std::vector<SumTable>>* kept) {
    const Cap limit{cap, least_rate_, layers_};
    const std::vector<std::vector<double>> most = layerLimits(bound);
    std::map<std::tuple<int, int, int>, std::vector<double>> rests;
    auto place = [&](const SumTable& table, int id, int mask, int t, int g) {
      SumTable result(fronts_, tail_cap_ + 1, layers_ + 1);
      Cap bounded = limit;
      if (cap < kInf) {
        auto found = rests.find({mask, t, g});
        if (found == rests.end()) found = rests.emplace(std::make_tuple(mask, t, g), leastRest(most, mask, t, g)).first;
        bounded.rest = &found->second;
      }
      placeSum(table, shapes_->at(id, bound), bounded, tail_cap_, result);
      return result;
    };
    auto trim = [&](int mask, int partial, SumTable& table) { trimLayers(most, mask, partial, table); };
    return sweep<SumTable>(startSum(fronts_, tail_cap_, layers_), place, kept, trim);
  }

  // orders_dp.AllOrders._least_rest: per layer count placed, a lower bound on what the groups still to place add
  // once type t's group g is placed (t's groups before g and every type outside the set): at least one layer each,
  // at most what it admits under M, each layer at the least rate of the group's steps
  std::vector<double> leastRest(const std::vector<std::vector<double>>& most, int mask, int t, int g) const {
    std::vector<std::pair<double, double>> groups;
    for (int u = 0; u < types_; ++u)
      if (!(mask >> u & 1))
        for (int h = 0; h < groupsOf(u); ++h) groups.emplace_back(least_rates_[u][h], most[u][h]);
    for (int h = 0; h < g; ++h) groups.emplace_back(least_rates_[t][h], most[t][h]);
    return leastFill(std::move(groups), layers_);
  }

  int groupsOf(int t) const { return static_cast<int>(rest_[static_cast<size_t>(t) * 2].size()) + 1; }

  // orders_dp.AllOrders._group_layer_limits: per type, per group (pipeline order), the most layers the group's
  // stages admit under M in any order, position and front (a valid step's hi at any tail; -inf: none)
  std::vector<std::vector<double>> layerLimits(double bound) {
    std::vector<std::vector<double>> most(types_);
    for (int t = 0; t < types_; ++t) {
      const int count = groupsOf(t);
      most[t].assign(count, -kInf);
      auto take = [&](int g, int id) {
        const Shape& shape = shapes_->at(id, bound);
        for (int p = 0; p < shape.pairs; ++p)
          for (int tail = 0; tail <= tail_cap_ && tail < shape.tails; ++tail) {
            const size_t at = static_cast<size_t>(p) * shape.tails + tail;
            if (shape.valid[at]) most[t][g] = std::max(most[t][g], shape.hi[at]);
          }
      };
      for (int starts = 0; starts < 2; ++starts) {
        const std::vector<int>& rest = rest_[static_cast<size_t>(t) * 2 + starts];
        for (size_t i = 0; i < rest.size(); ++i) take(count - 2 - static_cast<int>(i), rest[i]);
        for (int front = -1; front < types_; ++front)
          if (front != t) take(count - 1, last_[(static_cast<size_t>(t) * (types_ + 1) + front + 1) * 2 + starts]);
      }
    }
    return most;
  }

  // orders_dp.AllOrders._layer_trim: clear the layer counts the groups still to place (every type outside the
  // set, and the partial type's groups but its last) cannot complete to L, holding at least one layer each and at
  // most what their stages admit under M
  void trimLayers(const std::vector<std::vector<double>>& most, int mask, int partial, SumTable& table) const {
    double most_ahead = 0.0;
    int count_ahead = 0;
    for (int t = 0; t < types_; ++t) {
      if (mask >> t & 1) continue;
      double sum = 0.0;
      for (double held : most[t]) sum += held;
      most_ahead += sum;
      count_ahead += static_cast<int>(most[t].size());
    }
    if (partial >= 0) {
      double sum = 0.0;
      for (size_t g = 0; g + 1 < most[partial].size(); ++g) sum += most[partial][g];
      most_ahead += sum;
      count_ahead += static_cast<int>(most[partial].size()) - 1;
    }
    const double fewest = layers_ - most_ahead;  // layers placed below this cannot reach L
    const int first = fewest > 0 ? static_cast<int>(std::ceil(std::min(fewest, layers_ + 1.0))) : 0;
    table.keepColumns(first, layers_ - count_ahead);
  }

  // orders_dp.AllOrders._sweep: the tables after every (set, front type), by set size; kept (when given): per
  // (set, type) the type's tables after its last group (merged over the types in front) and after each other one;
  // trim(set, type whose last group alone is placed or -1, table) clears what cannot finish
  template <typename Table, typename Place, typename Trim>
  std::map<Key, Table> sweep(const Table& start, Place place, std::map<Key, std::vector<Table>>* kept, Trim trim) {
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
          Table after = place(table, last_[(static_cast<size_t>(t) * (types_ + 1) + front + 1) * 2 + (placed == full)],
                              placed, t, groupsOf(t) - 1);
          auto found = partial.find({placed, t});
          if (found == partial.end())
            partial.emplace(Key{placed, t}, std::move(after));
          else
            found->second.merge(after);
        }
      }
      std::map<Key, Table> next;
      for (auto& [key, table] : partial) {
        trim(key.first, key.second, table);
        Table current = std::move(table);
        std::vector<Table>* stages = kept ? &(*kept)[key] : nullptr;
        const std::vector<int>& rest = rest_[static_cast<size_t>(key.second) * 2 + (key.first == full)];
        for (size_t i = 0; i < rest.size(); ++i) {
          if (!current.reachable()) break;
          Table after = place(current, rest[i], key.first, key.second, groupsOf(key.second) - 2 - static_cast<int>(i));
          if (stages) stages->push_back(std::move(current));
          current = std::move(after);
        }
        trim(key.first, -1, current);
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
  std::vector<std::vector<double>> least_rates_;
};

// Ascending, by a radix sort of the bits (ordered as the doubles are; no NaN): the candidates are ten thousand and
// more values per problem, and std::sort took most of the time the search spent on them.
void sortDoubles(std::vector<double>& values) {
  constexpr int kBits = 11, kPasses = (64 + kBits - 1) / kBits;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  std::vector<uint64_t> keys(values.size()), other(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint64_t bits;
    std::memcpy(&bits, &values[i], sizeof bits);
    keys[i] = bits >> 63 ? ~bits : bits | uint64_t{1} << 63;
  }
  std::vector<size_t> counts(size_t{1} << kBits);
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = pass * kBits;
    std::fill(counts.begin(), counts.end(), 0);
    for (uint64_t key : keys) ++counts[key >> shift & kMask];
    if (counts[keys.empty() ? 0 : keys[0] >> shift & kMask] == keys.size()) continue;  // one digit: in order
    size_t total = 0;
    for (size_t& count : counts) total += std::exchange(count, total);
    for (uint64_t key : keys) other[counts[key >> shift & kMask]++] = key;
    keys.swap(other);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const uint64_t bits = keys[i] >> 63 ? keys[i] & ~(uint64_t{1} << 63) : ~keys[i];
    std::memcpy(&values[i], &bits, sizeof bits);
  }
}

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
  sortDoubles(values);
  values.erase(std::unique(values.begin(), values.end()), values.end());
  py::array_t<double> result(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), result.mutable_data());
  return result;
}

// memory.stage_caps_table's rounding: per stage kind (its fixed bytes) and per count of micro-batches in flight
// (the per-layer bytes), the most layers (0..limit) with fixed + layers * per_layer <= capacity, as numpy rounds.
py::array_t<double> stageCaps(const py::array_t<double, py::array::c_style | py::array::forcecast>& fixed,
                              const py::array_t<double, py::array::c_style | py::array::forcecast>& per_layer,
                              double capacity, double limit) {
  const py::ssize_t kinds = fixed.size(), counts = per_layer.size();
  py::array_t<double> result({kinds, counts});
  double* out = result.mutable_data();
  for (py::ssize_t i = 0; i < kinds; ++i) {
    const double base = fixed.data()[i];
    for (py::ssize_t j = 0; j < counts; ++j) {
      const double each = per_layer.data()[j];
      double layers = std::floor((capacity - base) / each);
      if (std::isnan(layers))
        layers = limit;
      else if (layers == kInf)
        layers = limit;
      else if (layers == -kInf)
        layers = 0.0;
      layers = std::min(std::max(layers, 0.0), limit);
      for (int step = 0; step < 3; ++step) {  // land exactly where fixed + layers * per_layer stops fitting
        if (layers > 0 && base + layers * each > capacity) layers -= 1;
        if (layers < limit && base + (layers + 1) * each <= capacity) layers += 1;
      }
      out[i * counts + j] = base + each > capacity ? 0.0 : layers;
    }
  }
  return result;
}

}  // namespace
}  // namespace heteroauto

PYBIND11_MODULE(_dp, m) {
  using namespace heteroauto;
  m.doc() = "The planner's dynamic programmes (heteroauto.layer_dp, heteroauto.orders_dp) in C++.";
  m.def("candidates", &candidates, py::arg("pairs"), py::arg("layers"),
        "Every A * k + KW (k = 1..layers) of the (A, KW) rows, sorted, each once (layer_dp.candidates_of_pairs)");
  m.def("stage_caps", &stageCaps, py::arg("fixed"), py::arg("per_layer"), py::arg("capacity"), py::arg("limit"),
        "memory.stage_caps_table's rounding: (kinds, counts) most layers per fixed and per-layer bytes");
  py::class_<Shapes, std::shared_ptr<Shapes>>(m, "Shapes")
      .def(py::init<>())
      .def("options", &Shapes::options, py::arg("tp"), py::arg("pp"), py::arg("compute"), py::arg("update"),
           py::arg("first_extra"), py::arg("first_update"), py::arg("last_extra"), py::arg("last_update"),
           py::arg("inner_send"), py::arg("middle"), py::arg("first"), py::arg("last"), py::arg("both"))
      .def("make", &Shapes::make, py::arg("options"), py::arg("tp_values"), py::arg("sends"), py::arg("first_group"),
           py::arg("last_group"), py::arg("monotone_next"), py::arg("relaxed"), py::arg("b_minus_alpha"),
           py::arg("tail_cap"))
      .def("pairs", &Shapes::pairs)
      .def("steps", &Shapes::steps, "(hi, valid) of a shape's steps under a bound, as layer_dp.group_steps");
  py::class_<Ordered>(m, "Ordered")
      .def(py::init<std::shared_ptr<Shapes>, std::vector<int>, int, int, int, int, double>(), py::arg("shapes"),
           py::arg("groups"), py::arg("fronts"), py::arg("tail_cap"), py::arg("stage_cap"), py::arg("layers"),
           py::arg("least_rate"))
      .def("most_layers", &Ordered::mostLayers, py::arg("bound"))
      .def("least_sum", &Ordered::leastSum, py::arg("bound"), py::arg("cap"))
      .def("trace", &Ordered::trace, py::arg("bound"), py::arg("cap"));
  py::class_<AllOrders>(m, "AllOrders")
      .def(py::init<std::shared_ptr<Shapes>, int, std::vector<int>, std::vector<std::vector<int>>, int, int, int, int,
                    double>(),
           py::arg("shapes"), py::arg("types"), py::arg("last"), py::arg("rest"), py::arg("fronts"),
           py::arg("tail_cap"), py::arg("stage_cap"), py::arg("layers"), py::arg("least_rate"))
      .def("most_layers", &AllOrders::mostLayers, py::arg("bound"))
      .def("least_sum", &AllOrders::leastSum, py::arg("bound"), py::arg("cap"))
      .def("best_order", &AllOrders::bestOrder, py::arg("bound"), py::arg("cap"));
}
