package fleet

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Series is one line of a Plot.
type Series struct {
	Name string
	X, Y []float64
}

// Plot is a small line chart written as standalone SVG: enough for latency
// against load per policy, with no plotting dependency.
type Plot struct {
	Title, XLabel, YLabel string
	// LogY draws the y axis in powers of ten (values must be positive;
	// others are left out of the line).
	LogY   bool
	Series []Series
}

// Geometry of the chart, in SVG user units.
const (
	svgWidth, svgHeight = 760, 460
	padLeft, padRight   = 70, 190 // the legend sits in the right margin
	padTop, padBottom   = 40, 50
)

// palette is colour-blind friendly (Okabe–Ito), with a dash pattern per
// series as a second cue.
var palette = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#F0E442"}
var dashes = []string{"", "6,3", "2,2", "8,3,2,3", "", "6,3", "2,2", "8,3,2,3"}

// WriteSVG renders the plot.
func (p Plot) WriteSVG(w io.Writer) error {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("fleet: plot series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		for i := range s.X {
			if !p.usable(s.Y[i]) || math.IsNaN(s.X[i]) || math.IsInf(s.X[i], 0) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	if math.IsInf(xmin, 1) {
		return errors.New("fleet: plot has no usable points")
	}
	if xmax == xmin {
		xmin, xmax = xmin-1, xmax+1
	}
	var yticks []float64
	var ylo, yhi float64
	if p.LogY {
		ylo, yhi = math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
		if yhi == ylo {
			yhi++
		}
		for e := ylo; e <= yhi; e++ {
			yticks = append(yticks, math.Pow(10, e))
		}
	} else {
		step := niceStep((ymax - math.Min(ymin, 0)) / 6)
		ylo, yhi = math.Min(0, math.Floor(ymin/step)*step), math.Ceil(ymax/step)*step
		if yhi == ylo {
			yhi = ylo + step
		}
		for v := ylo; v <= yhi+step/2; v += step {
			yticks = append(yticks, v)
		}
	}
	xstep := niceStep((xmax - xmin) / 8)
	xlo, xhi := math.Floor(xmin/xstep)*xstep, math.Ceil(xmax/xstep)*xstep

	plotW, plotH := float64(svgWidth-padLeft-padRight), float64(svgHeight-padTop-padBottom)
	px := func(x float64) float64 { return padLeft + (x-xlo)/(xhi-xlo)*plotW }
	py := func(y float64) float64 {
		f := (y - ylo) / (yhi - ylo)
		if p.LogY {
			f = (math.Log10(y) - ylo) / (yhi - ylo)
		}
		return padTop + (1-f)*plotH
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, svgHeight, svgWidth, svgHeight)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", padLeft, esc(p.Title))
	// Grid and ticks.
	for _, v := range yticks {
		y := py(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", padLeft, y, padLeft+plotW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padLeft-6, y+4, tickLabel(v))
		if p.LogY && v < yticks[len(yticks)-1] {
			for _, m := range []float64{2, 5} {
				ym := py(v * m)
				fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f0f0f0"/>`+"\n", padLeft, ym, padLeft+plotW, ym)
			}
		}
	}
	for x := xlo; x <= xhi+xstep/2; x += xstep {
		X := px(x)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", X, padTop, X, padTop+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", X, padTop+plotH+16, tickLabel(x))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", padLeft, padTop, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", padLeft+plotW/2, svgHeight-10, esc(p.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padTop+plotH/2, esc(p.YLabel))
	// Lines, markers and legend.
	for si, s := range p.Series {
		color, dash := palette[si%len(palette)], dashes[si%len(dashes)]
		var pts []string
		for i := range s.X {
			if p.usable(s.Y[i]) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[i]), py(s.Y[i])))
			}
		}
		dashAttr := ""
		if dash != "" {
			dashAttr = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dashAttr, strings.Join(pts, " "))
		for _, pt := range pts {
			xy := strings.Split(pt, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], color)
		}
		ly := padTop + 10 + 20*si
		lx := svgWidth - padRight + 14
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly, lx+28, ly, color, dashAttr)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx+34, ly+4, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (p Plot) usable(y float64) bool {
	if math.IsNaN(y) || math.IsInf(y, 0) {
		return false
	}
	return !p.LogY || y > 0
}

// niceStep rounds a raw tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if !(raw > 0) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*e {
			return m * e
		}
	}
	return 10 * e
}

func tickLabel(v float64) string {
	switch a := math.Abs(v); {
	case a == 0:
		return "0"
	case a >= 1e6 || a < 1e-3:
		return fmt.Sprintf("%.0e", v)
	}
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

func esc(s string) string { return html.EscapeString(s) }
