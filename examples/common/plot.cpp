#include "plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace qgrad_examples {

namespace {

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

std::ofstream open_out(const std::string& path) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f.precision(9);
  return f;
}

// Text safe inside an SVG element or a single-quoted gnuplot string.
std::string clean(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '\'' || c == '"' || c == '\n' || c == '\\') out += ' ';
    else out += c;
  }
  return out;
}

std::string gp_text(const std::string& s) {
  std::string out;
  for (char c : s) out += (c == '\'' || c == '\n' || c == '\\') ? ' ' : c;
  return out;
}

bool use_gnuplot(PlotFormat format, const std::string& stem) {
  if (format == PlotFormat::svg) return false;
  // gnuplot reads paths from single-quoted strings: refuse what could end one.
  const bool safe = stem.find_first_of("'\n\\") == std::string::npos;
  if (format == PlotFormat::png) {
    if (!safe) throw std::runtime_error("output path unsuitable for gnuplot: " + stem);
    if (!on_path("gnuplot")) throw std::runtime_error("gnuplot is not on PATH");
    return true;
  }
  return safe && on_path("gnuplot");
}

void run_gnuplot(const std::string& script) {
  std::vector<char*> argv = {const_cast<char*>("gnuplot"), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  if (posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv.data(), environ) != 0)
    throw std::runtime_error("cannot start gnuplot");
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("gnuplot failed on " + script);
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

struct Frame {
  double w = 720, h = 440, left = 80, right = 20, top = 40, bottom = 60;
  double x0, x1, y0, y1;
  double px(double x) const { return left + (x - x0) / (x1 - x0) * (w - left - right); }
  double py(double y) const { return h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom); }
};

void pad_range(double& lo, double& hi) {
  if (!(hi > lo)) {
    lo -= 0.5;
    hi += 0.5;
    return;
  }
  const double m = 0.05 * (hi - lo);
  lo -= m;
  hi += m;
}

// Round tick positions (steps of 1, 2 or 5 times a power of ten) inside [lo, hi].
std::vector<double> nice_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / p < 1.5 ? p : raw / p < 3.5 ? 2 * p : raw / p < 7.5 ? 5 * p : 10 * p;
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * step && t.size() < 20; v += step)
    t.push_back(std::fabs(v) < 1e-12 * step ? 0.0 : v);
  return t;
}

void svg_axes(std::ostream& o, const Frame& f, const std::string& title, const std::string& xlabel,
              const std::string& ylabel) {
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << f.w << "\" height=\"" << f.h
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << f.w / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << clean(title)
    << "</text>\n";
  const double bx = f.left, by = f.h - f.bottom, ex = f.w - f.right, ey = f.top;
  o << "<rect x=\"" << bx << "\" y=\"" << ey << "\" width=\"" << ex - bx << "\" height=\"" << by - ey
    << "\" fill=\"none\" stroke=\"black\"/>\n";
  for (double xv : nice_ticks(f.x0, f.x1))
    o << "<line x1=\"" << f.px(xv) << "\" y1=\"" << by << "\" x2=\"" << f.px(xv) << "\" y2=\"" << by + 5
      << "\" stroke=\"black\"/><text x=\"" << f.px(xv) << "\" y=\"" << by + 18 << "\" text-anchor=\"middle\">"
      << fmt(xv) << "</text>\n";
  for (double yv : nice_ticks(f.y0, f.y1))
    o << "<line x1=\"" << bx - 5 << "\" y1=\"" << f.py(yv) << "\" x2=\"" << bx << "\" y2=\"" << f.py(yv)
      << "\" stroke=\"black\"/><text x=\"" << bx - 8 << "\" y=\"" << f.py(yv) + 4 << "\" text-anchor=\"end\">"
      << fmt(yv) << "</text>\n";
  o << "<text x=\"" << (bx + ex) / 2 << "\" y=\"" << f.h - 15 << "\" text-anchor=\"middle\">" << clean(xlabel)
    << "</text>\n";
  o << "<text transform=\"translate(18," << (by + ey) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << clean(ylabel) << "</text>\n";
}

void svg_legend(std::ostream& o, const Frame& f, const std::vector<std::string>& labels) {
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const double y = f.top + 16 + 16 * static_cast<double>(i), x = f.w - f.right - 150;
    o << "<line x1=\"" << x << "\" y1=\"" << y - 4 << "\" x2=\"" << x + 20 << "\" y2=\"" << y - 4 << "\" stroke=\""
      << kColors[i % 6] << "\" stroke-width=\"2\"/><text x=\"" << x + 26 << "\" y=\"" << y << "\">"
      << clean(labels[i]) << "</text>\n";
  }
}

struct Bins {
  double lo, hi, width;
  std::vector<double> counts;
};

Bins make_bins(const Histogram& h) {
  Bins b;
  b.lo = h.values.empty() ? 0 : *std::min_element(h.values.begin(), h.values.end());
  b.hi = h.values.empty() ? 1 : *std::max_element(h.values.begin(), h.values.end());
  if (!(b.hi > b.lo)) b.hi = b.lo + 1;
  const int n = std::max(1, h.bins);
  b.width = (b.hi - b.lo) / n;
  b.counts.assign(static_cast<std::size_t>(n), 0.0);
  for (double v : h.values) {
    auto k = static_cast<std::size_t>(std::clamp((v - b.lo) / b.width, 0.0, n - 1.0));
    b.counts[k] += 1;
  }
  return b;
}

}  // namespace

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    const std::string p = dir + "/" + program;
    if (::access(p.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(p)) return true;
  }
  return false;
}

std::string plot_lines(const LineChart& c, const std::string& stem, PlotFormat format) {
  if (use_gnuplot(format, stem)) {
    {
      auto d = open_out(stem + ".dat");
      for (const Series& s : c.series) {
        d << "# " << gp_text(s.label) << "\n";
        for (std::size_t i = 0; i < s.x.size(); ++i) d << s.x[i] << ' ' << s.y[i] << '\n';
        d << "\n\n";
      }
      auto g = open_out(stem + ".gp");
      g << "set terminal pngcairo size 800,500\nset output '" << stem << ".png'\n"
        << "set title '" << gp_text(c.title) << "'\nset xlabel '" << gp_text(c.xlabel) << "'\nset ylabel '"
        << gp_text(c.ylabel) << "'\nset grid\nset offsets graph 0.03, graph 0.03, graph 0.05, graph 0.05\nset key right center\nplot ";
      for (std::size_t i = 0; i < c.series.size(); ++i)
        g << (i ? ", " : "") << "'" << stem << ".dat' index " << i << " with linespoints lw 2 lc rgb '"
          << kColors[i % 6] << "' title '" << gp_text(c.series[i].label) << "'";
      g << "\n";
    }
    run_gnuplot(stem + ".gp");
    return stem + ".png";
  }
  Frame f;
  f.x0 = 1e300, f.x1 = -1e300, f.y0 = 1e300, f.y1 = -1e300;
  for (const Series& s : c.series)
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      f.x0 = std::min(f.x0, s.x[i]), f.x1 = std::max(f.x1, s.x[i]);
      f.y0 = std::min(f.y0, s.y[i]), f.y1 = std::max(f.y1, s.y[i]);
    }
  if (f.x0 > f.x1) f.x0 = 0, f.x1 = 1, f.y0 = 0, f.y1 = 1;
  pad_range(f.x0, f.x1);
  pad_range(f.y0, f.y1);
  auto o = open_out(stem + ".svg");
  svg_axes(o, f, c.title, c.xlabel, c.ylabel);
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    labels.push_back(s.label);
    o << "<polyline fill=\"none\" stroke=\"" << kColors[i % 6] << "\" stroke-width=\"2\" points=\"";
    for (std::size_t k = 0; k < s.x.size(); ++k) o << f.px(s.x[k]) << ',' << f.py(s.y[k]) << ' ';
    o << "\"/>\n";
    for (std::size_t k = 0; k < s.x.size(); ++k)
      o << "<circle cx=\"" << f.px(s.x[k]) << "\" cy=\"" << f.py(s.y[k]) << "\" r=\"3\" fill=\"" << kColors[i % 6]
        << "\"/>\n";
  }
  svg_legend(o, f, labels);
  o << "</svg>\n";
  return stem + ".svg";
}

std::string plot_histogram(const Histogram& h, const std::string& stem, PlotFormat format) {
  const Bins b = make_bins(h);
  const double top = b.counts.empty() ? 1 : *std::max_element(b.counts.begin(), b.counts.end());
  if (use_gnuplot(format, stem)) {
    {
      auto d = open_out(stem + ".dat");
      for (std::size_t k = 0; k < b.counts.size(); ++k)
        d << b.lo + (static_cast<double>(k) + 0.5) * b.width << ' ' << b.counts[k] << '\n';
      auto g = open_out(stem + ".gp");
      g << "set terminal pngcairo size 900,500\nset output '" << stem << ".png'\n"
        << "set title '" << gp_text(h.title) << "'\nset xlabel '" << gp_text(h.xlabel)
        << "'\nset ylabel 'count'\nset style fill solid 0.6\nset boxwidth " << b.width << "\nset xrange ["
        << b.lo - b.width << ":" << b.hi + b.width << "]\nset yrange [0:" << top * 1.1 << "]\n";
      for (double x : h.grid)
        if (x >= b.lo - b.width && x <= b.hi + b.width)
          g << "set arrow from " << x << ",graph 0 to " << x << ",graph 1 nohead lc rgb '#d62728' lw 0.5\n";
      g << "plot '" << stem << ".dat' using 1:2 with boxes lc rgb '#1f77b4' title 'weights', NaN with lines lc rgb "
        << "'#d62728' title '" << gp_text(h.grid_label) << "'\n";
    }
    run_gnuplot(stem + ".gp");
    return stem + ".png";
  }
  Frame f;
  f.w = 900;
  f.x0 = b.lo - b.width, f.x1 = b.hi + b.width, f.y0 = 0, f.y1 = top * 1.1;
  auto o = open_out(stem + ".svg");
  svg_axes(o, f, h.title, h.xlabel, "count");
  for (std::size_t k = 0; k < b.counts.size(); ++k) {
    const double x = b.lo + static_cast<double>(k) * b.width;
    o << "<rect x=\"" << f.px(x) << "\" y=\"" << f.py(b.counts[k]) << "\" width=\"" << f.px(x + b.width) - f.px(x)
      << "\" height=\"" << f.py(0) - f.py(b.counts[k]) << "\" fill=\"#1f77b4\" fill-opacity=\"0.6\"/>\n";
  }
  for (double x : h.grid)
    if (x >= f.x0 && x <= f.x1)
      o << "<line x1=\"" << f.px(x) << "\" y1=\"" << f.py(f.y0) << "\" x2=\"" << f.px(x) << "\" y2=\"" << f.py(f.y1)
        << "\" stroke=\"#d62728\" stroke-width=\"0.5\"/>\n";
  svg_legend(o, f, {"weights", h.grid_label});
  o << "</svg>\n";
  return stem + ".svg";
}

}  // namespace qgrad_examples
